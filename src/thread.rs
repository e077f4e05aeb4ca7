//! Per-thread identity: the kernel thread id (cached) and the thread's name on its first event.
//! Depends on nothing.

use std::cell::Cell;

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    static NAMED: Cell<bool> = const { Cell::new(false) };
}

/// The thread's name (`prctl(PR_GET_NAME)`), on its first event only: read here because the
/// thread may be gone by the time the writer gets to it.
#[link_section = ".text.hot.gpumemtrace"]
pub fn first_event_name() -> Option<String> {
    if NAMED.try_with(|n| n.replace(true)).unwrap_or(true) {
        return None;
    }
    let mut buf = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated, into the buffer.
    if unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(16);
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The kernel thread id, cached per thread (reset in a forked child).
#[link_section = ".text.hot.gpumemtrace"]
pub fn thread_id() -> u32 {
    TID.try_with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid has no preconditions.
        let v = unsafe { libc::gettid() } as u32;
        t.set(v);
        v
    })
    .unwrap_or_else(|_| {
        // SAFETY: as above.
        unsafe { libc::gettid() as u32 }
    })
}

/// After fork the child's only thread has a new id.
pub fn forget_thread_id() {
    let _ = TID.try_with(|t| t.set(0));
    let _ = NAMED.try_with(|n| n.set(false));
}

