//! Per-thread identity: the kernel thread id (cached) and the thread's name on its first event.
//! Depends on nothing.

use std::cell::Cell;

/// The thread's identity, in one thread-local: each lookup of a cdylib's thread-local is a call
/// into the loader, and an event needs the id and the first-event flag together.
struct Me {
    tid: Cell<u32>,
    named: Cell<bool>,
    /// 0: not known yet, 1: the process's main thread (its id is the process id), 2: another.
    main: Cell<u8>,
}

thread_local! {
    // const-initialised and Drop-free: usable at any point of a thread's life, teardown included.
    static ME: Me = const { Me { tid: Cell::new(0), named: Cell::new(false), main: Cell::new(0) } };
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

impl Me {
    #[inline]
    fn tid(&self) -> u32 {
        match self.tid.get() {
            0 => {
                let v = gettid();
                self.tid.set(v);
                v
            }
            v => v,
        }
    }

    /// The thread's name (`prctl(PR_GET_NAME)`), the first time only.
    #[inline]
    fn first_name(&self) -> Option<String> {
        if self.named.replace(true) {
            return None;
        }
        read_name()
    }

    #[inline]
    fn is_main(&self) -> bool {
        match self.main.get() {
            0 => {
                // SAFETY: getpid has no preconditions.
                let main = self.tid() == unsafe { libc::getpid() } as u32;
                self.main.set(if main { 1 } else { 2 });
                main
            }
            m => m == 1,
        }
    }
}

#[cold]
fn read_name() -> Option<String> {
    let mut buf = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated, into the buffer.
    if unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(16);
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The kernel thread id (cached), and the thread's name on its first event only (read here
/// because the thread may be gone by the time the writer gets to it): one thread-local lookup.
#[link_section = ".text.hot.gpumemtrace"]
pub fn identity() -> (u32, Option<String>) {
    ME.try_with(|m| (m.tid(), m.first_name())).unwrap_or_else(|_| (gettid(), None))
}

/// The kernel thread id, cached per thread (reset in a forked child).
#[link_section = ".text.hot.gpumemtrace"]
pub fn thread_id() -> u32 {
    ME.try_with(Me::tid).unwrap_or_else(|_| gettid())
}

/// Whether this is the process's main thread (thread id = process id), cached per thread.
#[link_section = ".text.hot.gpumemtrace"]
pub fn is_main_thread() -> bool {
    // SAFETY: getpid has no preconditions.
    ME.try_with(Me::is_main).unwrap_or_else(|_| gettid() == unsafe { libc::getpid() } as u32)
}

/// After fork the child's only thread has a new id (and is the child's main thread).
pub fn forget_thread_id() {
    let _ = ME.try_with(|m| {
        m.tid.set(0);
        m.main.set(0);
        m.named.set(false);
    });
}
