//! Per-thread state: the hook depth (`guard`), the kernel thread id (cached), whether it is the
//! main thread, and the thread's name on its first event. Depends on nothing.

use std::cell::Cell;

/// The thread's state, in one thread-local: each lookup of a cdylib's thread-local is a call into
/// the loader, and an event needs the guard's depth, the id and the first-event flag together
/// (the guard keeps where this is: `guard::Guard::identity`).
pub struct Me {
    /// The hook depth (see `guard`).
    pub(crate) depth: Cell<u32>,
    tid: Cell<u32>,
    named: Cell<bool>,
    /// 0: not known yet, 1: the process's main thread (its id is the process id), 2: another.
    main: Cell<u8>,
    /// The ring the tracer gave this thread, and for which tracer start (`clock::epoch`): a
    /// copy of the tracer's claim that a hook reads through its guard, without a second
    /// thread-local lookup (the claim itself, which gives the ring back at thread exit, clears it).
    pub(crate) ring: Cell<(u64, u32)>,
}

thread_local! {
    /// Set on the tracer's own threads (the writer, the batch thread).
    static OURS: Cell<bool> = const { Cell::new(false) };
    // const-initialised and Drop-free: usable at any point of a thread's life, teardown included.
    static ME: Me = const { Me { depth: Cell::new(0), tid: Cell::new(0), named: Cell::new(false), main: Cell::new(0), ring: Cell::new((u64::MAX, 0)) } };
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

    /// The kernel thread id, and the thread's name on its first event only (read here because
    /// the thread may be gone by the time the writer gets to it).
    #[inline]
    pub fn identity(&self) -> (u32, Option<String>) {
        (self.tid(), self.first_name())
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
    pub fn is_main(&self) -> bool {
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

/// `f` of this thread's state (`None` only if the thread-local were gone: it has no destructor).
#[link_section = ".text.hot.gpumemtrace"]
pub fn with_me<R>(f: impl FnOnce(&Me) -> R) -> Option<R> {
    ME.try_with(f).ok()
}

/// The thread's ring is given back (it ends): hooks of its last moments look the claim up again.
pub fn forget_ring() {
    let _ = ME.try_with(|m| m.ring.set((u64::MAX, 0)));
}

/// The kernel thread id, cached per thread (reset in a forked child).
#[link_section = ".text.hot.gpumemtrace"]
pub fn thread_id() -> u32 {
    ME.try_with(Me::tid).unwrap_or_else(|_| gettid())
}

/// After fork the child's only thread has a new id (and is the child's main thread).
pub fn forget_thread_id() {
    let _ = ME.try_with(|m| {
        m.tid.set(0);
        m.main.set(0);
        m.named.set(false);
    });
}

/// Whether the calling thread is one of the tracer's own (started by `spawn_without_signals`).
pub fn is_ours() -> bool {
    OURS.try_with(|o| o.get()).unwrap_or(false)
}

/// Starts a thread of the tracer's own with every signal blocked, so the host's signals go to
/// the host's threads.
pub fn spawn_without_signals(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    // SAFETY: sigset manipulation on local values; the old mask is restored right after.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = std::thread::Builder::new().name(name.into()).spawn(move || {
            OURS.with(|o| o.set(true));
            f()
        });
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        // Named from here too, before the call returns: the new thread names itself only once it
        // runs, and a host listing its threads right after its first allocation would see it
        // under the host's name.
        if let (Ok(h), Ok(c)) = (&r, std::ffi::CString::new(name)) {
            use std::os::unix::thread::JoinHandleExt;
            libc::pthread_setname_np(h.as_pthread_t(), c.as_ptr());
        }
        r.map(|_| ())
    }
}
