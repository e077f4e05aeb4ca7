//! Cache hints for the hot path. On a busy host (PyTorch runs megabytes of its own code and data
//! between two events) much of a hook's time is spent waiting for lines; a hint issued early,
//! for a line known to be needed next time, lets the wait happen while the host runs on.

/// The line at `p` will be written soon (x86-64 `prefetchw`, which CPUs without it run as a
/// no-op): its ownership is taken from another core's cache meanwhile.
#[inline(always)]
pub fn write(p: u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults (any address) and changes no register, flag or memory.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
