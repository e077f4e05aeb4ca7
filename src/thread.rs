//! Per-thread identity: the kernel thread id (cached) and the thread's name on its first event.
//! Depends on nothing.

use std::cell::Cell;

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    static NAMED: Cell<bool> = const { Cell::new(false) };
    /// 0: not known yet, 1: the process's main thread (its id is the process id), 2: another.
    static MAIN: Cell<u8> = const { Cell::new(0) };
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

/// Whether this is the process's main thread (thread id = process id), cached per thread.
#[link_section = ".text.hot.gpumemtrace"]
pub fn is_main_thread() -> bool {
    let known = MAIN.try_with(|m| m.get()).unwrap_or(0);
    if known != 0 {
        return known == 1;
    }
    // SAFETY: getpid has no preconditions.
    let main = thread_id() == unsafe { libc::getpid() } as u32;
    let _ = MAIN.try_with(|m| m.set(if main { 1 } else { 2 }));
    main
}

/// After fork the child's only thread has a new id (and is the child's main thread).
pub fn forget_thread_id() {
    let _ = TID.try_with(|t| t.set(0));
    let _ = MAIN.try_with(|m| m.set(0));
    let _ = NAMED.try_with(|n| n.set(false));
}

