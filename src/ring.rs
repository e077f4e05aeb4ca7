//! The journal in this process: a shared file mapping beside the trace holding one ring a
//! thread, through which hooks hand events to the writer (layout and protocol:
//! `gpumemtrace_format::journal`, docs/format.md). Each thread owns a ring (one producer, the
//! writer the one consumer: no lock, no shared counter on the hot path); threads beyond the
//! rings share the last one under a lock. The page cache holds what a hook wrote even after the
//! process dies, so the trace can be completed from the journal after a `SIGKILL`.
//!
//! Uses `output` (no SIGXFSZ while the journal file grows), `prefetch`, and nothing else in the crate.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};

use crossbeam_utils::CachePadded;
use gpumemtrace_format::journal::{self as j, header, ring};

pub use j::RINGS;
/// The ring that threads without one of their own share.
pub const SHARED: usize = RINGS - 1;

/// How long a hook waits for room in its ring before it gives its event up (the output does
/// not keep up: a stalled disk, an unread FIFO). Then hooks stop waiting until the writer has
/// made room again, so a stalled output costs the host at most this, once.
pub const MAX_WAIT_MS: u64 = 1000;
/// Largest payload `push_in_place` takes (a warm event is well under it: 35 to about 90 bytes).
pub const IN_PLACE_MAX: usize = 256;
/// Events given up that way.
pub static GIVEN_UP: AtomicU64 = AtomicU64::new(0);
/// Hand-overs that found their ring full and waited (the writer had fallen behind).
pub static WAITED: AtomicU64 = AtomicU64::new(0);
/// Commits that gave producers space back: a waiting hook tells a slow writer from a stalled one.
/// The writer bumps it at every commit: padded, so hooks reading their neighbours (the clock
/// map, the epoch) do not lose the line each time.
static COMMITS: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

/// Bumped by the writer as it reads and writes a backlog, between commits: a writer short of
/// CPU may take longer than a hook's wait between two commits (its first pass over forty full
/// rings, in a debug build on two busy cores, took seconds), and is still no stalled output.
/// On its own line, like `COMMITS`, read by hooks only while they wait for room.
static WORKED: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

/// On the writer: it has read or written some messages since the last call.
pub fn note_work() {
    WORKED.fetch_add(1, Relaxed);
}

/// What a waiting hook watches to see the writer move: its commits and its work between them.
pub fn writer_moves() -> u64 {
    COMMITS.load(Acquire).wrapping_add(WORKED.load(Relaxed))
}

/// The shared ring's mark: how many of the threads that share it are between their stamp and
/// their hand-over (their own marks would be one word written by many threads anyway).
static SHARED_IN_FLIGHT: CachePadded<AtomicU32> = CachePadded::new(AtomicU32::new(0));

/// The line of a ring's control page that its owner writes at every event, at the offsets
/// `journal::ring` names (checked at compile time below).
#[repr(C)]
struct Line {
    head: AtomicU64,
    busy: AtomicU32,
    stamp_gen: AtomicU32,
    seen: AtomicU64,
    stamp_key: AtomicU64,
}

const _: () = {
    assert!(std::mem::offset_of!(Line, head) as u64 == ring::HEAD);
    assert!(std::mem::offset_of!(Line, busy) as u64 == ring::BUSY);
    assert!(std::mem::offset_of!(Line, stamp_gen) as u64 == ring::STAMP_GEN);
    assert!(std::mem::offset_of!(Line, seen) as u64 == ring::SEEN);
    assert!(std::mem::offset_of!(Line, stamp_key) as u64 == ring::STAMP_KEY);
};

/// A ring's marks (`Journal::marks`): one pointer to its owner's line, found once a stamp and
/// passed along with its mark, so `enter`, `note_key` and `leave` compute no offsets.
#[derive(Clone, Copy, Debug)]
pub struct Marks {
    line: &'static Line,
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line").field("busy", &self.busy).finish_non_exhaustive()
    }
}

/// A thread's mark, as `enter` set it: what `leave` does.
#[derive(Clone, Copy, Debug)]
pub enum Mark {
    /// The thread's own ring; its generation before `enter`.
    Own(Marks, u32),
    Shared,
    /// The mark was already set (a signal handler's call inside an outer one): `leave` leaves
    /// it to the outer call.
    Nested,
}

/// How the writer saw a ring's mark (`Journal::stamping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Idle,
    /// Stamping: generation (own ring), or the count of threads in flight (shared ring).
    Busy(u32),
}

/// Adds one to a word that only the calling thread (and its signal handlers) writes, in one
/// instruction: a signal cannot fall inside it, and, unlike a locked one, it waits for nothing.
#[inline(always)]
fn bump(word: &AtomicU32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an aligned u32 of the journal's mapping, alive for the process; no other thread
    // writes it (readers on other CPUs see the old value or the new, as with a plain store).
    unsafe {
        core::arch::asm!("add dword ptr [{0}], 1", in(reg) word.as_ptr(), options(nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    word.fetch_add(1, Relaxed);
}

pub struct Journal {
    base: *mut u8,
    len: usize,
    /// The file, or `None` for an anonymous mapping (no place for a file beside the trace).
    pub path: Option<PathBuf>,
}

// SAFETY: the mapping is shared memory accessed through atomics (positions, owners, locks) and
// through byte ranges that the protocol gives to one side at a time.
unsafe impl Send for Journal {}
unsafe impl Sync for Journal {}

/// Gives the file its blocks now: a page of a shared mapping that the disk cannot back would
/// kill the process with SIGBUS when written, so a journal is on disk in full or not at all.
fn reserve(f: &std::fs::File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on our own descriptor.
    let r = crate::output::without_sigxfsz(|| unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) });
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Journal {
    /// A journal beside `trace` (created like the trace: O_EXCL, O_NOFOLLOW, `mode`), or in
    /// anonymous shared memory when `beside_trace` is false or the file cannot be made.
    pub fn create(trace: &Path, mode: u32, beside_trace: bool) -> io::Result<Journal> {
        let len = j::file_len() as usize;
        let mut path = None;
        let mut fd = -1;
        let file = if beside_trace {
            let p = j::path_for(trace);
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&p)
                .and_then(|f| reserve(&f, len as u64).map(|_| f))
                .map(|f| (f, p.clone()))
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&p);
                })
                .ok()
        } else {
            None
        };
        if let Some((f, p)) = &file {
            use std::os::fd::AsRawFd;
            fd = f.as_raw_fd();
            path = Some(p.clone());
        }
        let flags = if fd < 0 { libc::MAP_SHARED | libc::MAP_ANONYMOUS } else { libc::MAP_SHARED };
        // SAFETY: a fresh mapping of our own file (or anonymous memory); nothing else is mapped
        // at the address the kernel picks. The descriptor can close right after: the mapping
        // keeps the file, and no descriptor of ours is left for a host to close or reuse.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        drop(file);
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if let Some(p) = &path {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
        let jn = Journal { base: base.cast(), len, path };
        jn.bytes(0, j::MAGIC);
        jn.u32(header::VERSION).store(j::VERSION, Relaxed);
        jn.u32(header::RINGS).store(RINGS as u32, Relaxed);
        jn.u64(header::RING_BYTES).store(j::RING_BYTES, Relaxed);
        jn.u32(header::PID).store(std::process::id(), Release);
        Ok(jn)
    }

    // Inlined: a call of its own on every warm event otherwise (twice), for a bounds check.
    #[inline(always)]
    fn u64(&self, off: u64) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && (off as usize) + 8 <= self.len);
        // SAFETY: aligned, inside the mapping, which lives as long as `self`.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }

    fn u32(&self, off: u64) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && (off as usize) + 4 <= self.len);
        // SAFETY: as above.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }
    }

    /// Copies `src` into the mapping at `off`.
    #[link_section = ".text.hot.gpumemtrace"]
    fn bytes(&self, off: u64, src: &[u8]) {
        assert!(off as usize + src.len() <= self.len);
        // SAFETY: inside the mapping; the protocol gives this range to the caller alone.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off as usize), src.len()) };
    }

    /// Copies from the mapping at `off` into `dst`.
    fn read(&self, off: u64, dst: &mut [u8]) {
        assert!(off as usize + dst.len() <= self.len);
        // SAFETY: as above; the producer published this range before we read it.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off as usize), dst.as_mut_ptr(), dst.len()) };
    }

    fn control(i: usize, field: u64) -> u64 {
        j::ring_offset(i) + field
    }

    /// Where ring `i`'s data begins in the mapping.
    fn data(i: usize) -> u64 {
        j::ring_offset(i) + j::RING_CONTROL
    }

    /// A ring for thread `tid`: a free one of its own if any is left, else the shared one.
    pub fn claim(&self, tid: u32) -> usize {
        for i in 0..SHARED {
            if self.u32(Self::control(i, ring::OWNER)).compare_exchange(0, tid.max(1), AcqRel, Relaxed).is_ok() {
                return i;
            }
        }
        SHARED
    }

    fn busy(&self, i: usize) -> &AtomicU32 {
        self.u32(Self::control(i, ring::BUSY))
    }

    /// The calling thread, which hands its events to ring `i`, is about to take an order key
    /// (`clock::stamp`) and stays marked until its event is in the ring (`leave`). The mark is
    /// a generation, odd while stamping, on the owner's own cache line (no line shared between
    /// threads). The writer reads the marks after its own clock read (`clock::horizon`): a ring
    /// idle then can only stamp later keys, and a busy one is waited for until its generation
    /// moves on. Also what the exit drain waits for (`any_busy`).
    ///
    /// The mark is a plain store, not a locked instruction: a locked one waits for the line and
    /// for every store before it, and that wait was most of an event's stamp on a busy host
    /// (cold lines). The store may then become visible a little after the clock is read; the
    /// writer's horizon stays `clock::SLACK_NS` behind its own clock read for that (numbered keys
    /// need no slack: taking a number is itself a locked instruction, after the mark).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn enter(marks: Option<Marks>) -> Mark {
        let Some(marks) = marks else {
            SHARED_IN_FLIGHT.fetch_add(1, SeqCst);
            return Mark::Shared;
        };
        let b = &marks.line.busy;
        let g = b.load(Relaxed); // only the owner (and its signal handlers) write it
        if g & 1 == 1 {
            return Mark::Nested;
        }
        // A signal handler's nested call between the load and the increment moves the
        // generation on by two (its own enter and leave); the increment, one instruction, then
        // starts from there, and the generation is read back. Once it is odd, nested calls leave
        // it alone until `leave`.
        #[cfg(test)]
        tests::BETWEEN.with(|f| f.take().map(|f| f()));
        bump(b);
        let mut odd = b.load(Relaxed);
        if odd & 1 == 0 {
            // A nested call entered in that window and never left (a handler that jumped out):
            // its mark was left odd, and the increment made it even. One more makes it this
            // call's own again (the nested event, if any, is written late).
            bump(b);
            odd = b.load(Relaxed);
        }
        Mark::Own(marks, odd.wrapping_sub(1))
    }

    /// The order key the thread took after `enter` (`mark`): the writer need not wait for the
    /// event itself to write everything before it (a thread that waits for room in its ring,
    /// or a free inside its real call, holds back only what comes after it).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn note_key(mark: Mark, key: u64) {
        if let Mark::Own(m, g) = mark {
            m.line.stamp_key.store(key, Release);
            m.line.stamp_gen.store(g.wrapping_add(1), Release);
        }
    }

    /// The marks of ring `i` (none for the shared ring, whose threads count themselves in flight).
    pub fn marks(&'static self, i: usize) -> Option<Marks> {
        (i != SHARED).then(|| Marks { line: self.line(i) })
    }

    /// The line of ring `i`'s control page that its producer writes at every event.
    #[inline(always)]
    fn line(&self, i: usize) -> &Line {
        let off = Self::control(i, 0);
        assert!(off.is_multiple_of(8) && off as usize + std::mem::size_of::<Line>() <= self.len);
        // SAFETY: the first words of ring `i`'s control page: 8-aligned, inside the mapping,
        // which lives as long as `self`; `Line` is atomics only, at the format's offsets
        // (checked at compile time above).
        unsafe { &*(self.base.add(off as usize) as *const Line) }
    }

    /// On the writer: the key of ring `i`'s event in progress, if its owner (seen stamping in
    /// generation `was`) has taken it.
    pub fn stamped_key(&self, i: usize, was: u32) -> Option<u64> {
        if i == SHARED || self.u32(Self::control(i, ring::STAMP_GEN)).load(Acquire) != was {
            return None;
        }
        let key = self.u64(Self::control(i, ring::STAMP_KEY)).load(Relaxed);
        // The key read belongs to `was` only if the generation is still `was` (the owner may
        // have left and noted the next one's key meanwhile).
        fence(Acquire);
        (self.u32(Self::control(i, ring::STAMP_GEN)).load(Relaxed) == was).then_some(key)
    }

    /// Ends what `enter` began: everything the thread wrote to its ring is published before
    /// (Release) the generation moves on.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn leave(mark: Mark) {
        match mark {
            Mark::Own(m, g) => m.line.busy.store(g.wrapping_add(2), Release),
            Mark::Shared => {
                SHARED_IN_FLIGHT.fetch_sub(1, SeqCst);
            }
            Mark::Nested => {}
        }
    }

    /// On the writer, after `clock::horizon`: whether ring `i`'s producer (or, for the shared
    /// ring, any of its producers) is stamping or handing over.
    pub fn stamping(&self, i: usize) -> Seen {
        let v = if i == SHARED { SHARED_IN_FLIGHT.load(SeqCst) } else { self.busy(i).load(SeqCst) };
        let busy = if i == SHARED { v != 0 } else { v & 1 == 1 };
        if busy {
            Seen::Busy(v)
        } else {
            Seen::Idle
        }
    }

    /// Whether a producer seen `Busy(v)` on ring `i` has since handed its event over (its entry
    /// is then in the ring). The shared ring's count says so only when it falls to zero:
    /// another thread may have entered meanwhile.
    pub fn moved_on(&self, i: usize, was: u32) -> bool {
        if i == SHARED {
            SHARED_IN_FLIGHT.load(Acquire) == 0
        } else {
            self.busy(i).load(Acquire) != was
        }
    }

    /// Whether any ring's producer is stamping or handing an event over, as seen after a full
    /// barrier: call it after changing what `enter`'s callers read next (the tracer's state).
    pub fn any_busy(&self) -> bool {
        fence(SeqCst);
        (0..RINGS).any(|i| self.stamping(i) != Seen::Idle)
    }

    /// In a forked child: no thread of the child is inside a hand-over.
    pub fn reset_shared_mark() {
        SHARED_IN_FLIGHT.store(0, SeqCst);
    }

    /// The thread that owned ring `i` is gone; what it wrote stays for the writer.
    pub fn release(&self, i: usize) {
        if i != SHARED {
            self.u32(Self::control(i, ring::OWNER)).store(0, Release);
        }
    }

    /// Where ring `i`'s producer has written up to.
    pub fn head(&self, i: usize) -> u64 {
        self.u64(Self::control(i, ring::HEAD)).load(Acquire)
    }

    /// Appends one entry to ring `i` (the caller's own, or `SHARED`). While the ring has no
    /// room, `wait` is called; when it says to give up, the entry is not written and `None` is
    /// returned. Else the ring's fill after the entry.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn push(&self, i: usize, payload: &[u8], wait: impl FnMut(u32) -> bool) -> Option<u64> {
        debug_assert!(payload.len() + j::FRAME as usize <= j::MAX_ENTRY);
        self.locked(i, || {
            self.push_owned(i, payload.len(), wait, |pos| {
                self.ring_write(i, pos, payload);
                payload.len()
            })
        })
    }

    /// As `push`, for a payload of at most `max` bytes (at most `IN_PLACE_MAX`) that `fill`
    /// writes, returning how many: straight into the ring where `max` bytes do not wrap around
    /// the ring's end (no buffer in between, whose cache lines a cold hook would pay for), else
    /// through one on the stack. Room is found for `max` bytes; the entry takes what was written.
    /// Inlined into the hooks (its one line of callers' code, not a call of its own).
    #[inline(always)]
    pub fn push_in_place(&self, i: usize, max: usize, wait: impl FnMut(u32) -> bool, fill: impl FnOnce(&mut [u8]) -> usize) -> Option<u64> {
        assert!(max <= IN_PLACE_MAX);
        self.locked(i, || {
            self.push_owned(i, max, wait, |pos| {
                let at = pos % j::RING_BYTES;
                if at + max as u64 <= j::RING_BYTES {
                    let off = (Self::data(i) + at) as usize;
                    assert!(off + max <= self.len);
                    // SAFETY: inside ring `i`'s data, in the range `push_owned` found free: the
                    // writer reads it only after the head moves past it, so for now this
                    // producer (or the shared ring's lock holder) alone touches these bytes.
                    fill(unsafe { std::slice::from_raw_parts_mut(self.base.add(off), max) }).min(max)
                } else {
                    self.fill_wrapping(i, pos, max, fill)
                }
            })
        })
    }

    /// `push_in_place`'s entry that would wrap around the ring's end: written on the stack,
    /// then copied in two pieces (once a lap).
    #[cold]
    #[inline(never)]
    fn fill_wrapping(&self, i: usize, pos: u64, max: usize, fill: impl FnOnce(&mut [u8]) -> usize) -> usize {
        let mut buf = [0u8; IN_PLACE_MAX];
        let len = fill(&mut buf[..max]).min(max);
        self.ring_write(i, pos, &buf[..len]);
        len
    }

    /// Runs `f` holding ring `i`'s lock if it is the shared one.
    #[inline(always)]
    fn locked<R>(&self, i: usize, f: impl FnOnce() -> R) -> R {
        // `f` is called from one place: called from two, it was compiled as a function of its
        // own (a call, its prologue and the closure's state copied, on every warm event).
        let lock = (i == SHARED).then(|| self.u32(Self::control(i, ring::LOCK)));
        if let Some(lock) = lock {
            Self::acquire(lock);
        }
        let r = f();
        if let Some(lock) = lock {
            lock.store(0, Release);
        }
        r
    }

    /// Takes the shared ring's lock (spinning, then yielding: its holders hold it for one entry).
    #[cold]
    fn acquire(lock: &AtomicU32) {
        let mut n = 0;
        while lock.compare_exchange_weak(0, 1, Acquire, Relaxed).is_err() {
            n += 1;
            if n % 64 == 0 {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// Finds room for an entry of up to `max` payload bytes (waiting as `wait` says), has
    /// `write` put the payload at its ring position (it returns its length, at most `max`),
    /// frames it and publishes it.
    #[inline(always)]
    fn push_owned(&self, i: usize, max: usize, mut wait: impl FnMut(u32) -> bool, write: impl FnOnce(u64) -> usize) -> Option<u64> {
        let room = j::entry_bytes(max);
        let line = self.line(i);
        let head_at = &line.head;
        let done_at = self.u64(Self::control(i, ring::COMMITTED));
        let head = head_at.load(Relaxed); // only this producer moves it
        // The committed position as this producer last read it, on the line of its head: positions
        // only grow, so room below it is known without reading the writer's word, whose line
        // the writer takes away at every commit. Only this producer (or the shared ring's lock
        // holder) uses it.
        let seen = &line.seen;
        let mut tries = 0;
        let mut done = seen.load(Relaxed);
        let done = loop {
            if head + room - done <= j::RING_BYTES {
                break done;
            }
            // The Acquire load that saw a position made the writer's reads below it happen
            // before this producer's writes there, now or on a later push.
            done = done_at.load(Acquire);
            seen.store(done, Relaxed);
            if head + room - done <= j::RING_BYTES {
                break done;
            }
            if tries == 0 {
                WAITED.fetch_add(1, Relaxed);
            }
            if !wait(tries) {
                return None;
            }
            tries += 1;
        };
        // The payload, then its frame (`len u32`, `!len u32`) as one 8-byte store: entries
        // start 8-aligned and the ring's size is a multiple of 8, so it never wraps (a copy of 8
        // bytes of unknown length was a call to memmove). Both are published by the head's
        // Release store below.
        let len = write(head + j::FRAME).min(max) as u32;
        let frame = (len as u64 | ((!len as u64) << 32)).to_le();
        let at = Self::data(i) + head % j::RING_BYTES;
        debug_assert!(at.is_multiple_of(8));
        self.u64(at).store(frame, Relaxed);
        let total = j::entry_bytes(len as usize);
        head_at.store(head + total, Release);
        // The next entry's lines, claimed for writing now, while the host runs on: the writer
        // read them a lap ago, so writing them cold would wait for another core's cache.
        let next = head + total;
        for ahead in [64, 128] {
            crate::prefetch::write(self.base as u64 + Self::data(i) + (next + ahead) % j::RING_BYTES);
        }
        Some(head + total - done)
    }

    /// Writes `src` at ring position `pos`, wrapping around the ring's end.
    #[link_section = ".text.hot.gpumemtrace"]
    fn ring_write(&self, i: usize, pos: u64, src: &[u8]) {
        j::pieces(pos, src.len(), |at, r| self.bytes(Self::data(i) + at, &src[r]));
    }

    fn ring_read(&self, i: usize, pos: u64, dst: &mut [u8]) {
        j::pieces(pos, dst.len(), |at, r| self.read(Self::data(i) + at, &mut dst[r]));
    }

    /// On the writer: the entries of ring `i` from `from` up to what producers published,
    /// each with its position; returns the position after the last one read.
    pub fn take(&self, i: usize, from: u64, mut each: impl FnMut(u64, &[u8])) -> u64 {
        let head = self.u64(Self::control(i, ring::HEAD)).load(Acquire);
        // As `journal::for_each_entry` reads a ring, but each payload goes through `payload`.
        let mut pos = from;
        let mut copy = Vec::new();
        while pos + j::FRAME <= head {
            let Some(len) = j::frame_len(self.frame(i, pos), head - pos) else { break };
            self.payload(i, pos, len, &mut copy, |p| each(pos, p));
            pos += j::entry_bytes(len);
        }
        pos
    }

    /// On the writer: the payload of the entry at `pos` of ring `i` (one that `take` gave),
    /// read again. Its space is not committed yet (see `Writer::committable`), so no producer
    /// has reused it.
    pub fn reread<R>(&self, i: usize, pos: u64, buf: &mut Vec<u8>, f: impl FnOnce(&[u8]) -> R) -> R {
        let len = u32::from_le_bytes(self.frame(i, pos)[..4].try_into().expect("4 bytes")) as usize;
        self.payload(i, pos, len.min(j::MAX_PAYLOAD), buf, f)
    }

    /// The frame of the entry at ring position `pos` (entries start 8-aligned and the ring's
    /// size is a multiple of 8: a frame never wraps).
    fn frame(&self, i: usize, pos: u64) -> [u8; j::FRAME as usize] {
        self.u64(Self::data(i) + pos % j::RING_BYTES).load(Relaxed).to_le_bytes()
    }

    /// Hands `f` the `len`-byte payload of the entry at `pos`: where it lies in the ring when
    /// it is in one piece (not copied out first), else put together in `copy`.
    fn payload<R>(&self, i: usize, pos: u64, len: usize, copy: &mut Vec<u8>, f: impl FnOnce(&[u8]) -> R) -> R {
        let at = (pos + j::FRAME) % j::RING_BYTES;
        if at + len as u64 <= j::RING_BYTES {
            let off = (Self::data(i) + at) as usize;
            assert!(off + len <= self.len);
            // SAFETY: inside ring `i`'s data, published by its producer (the writer read the
            // head with Acquire first) and not committed, so no producer writes these bytes
            // while the slice lives.
            return f(unsafe { std::slice::from_raw_parts(self.base.add(off), len) });
        }
        copy.resize(len, 0);
        self.ring_read(i, pos + j::FRAME, copy);
        f(copy)
    }

    /// On the writer, before a write to the trace: where each ring will stand, and how many
    /// events the trace will hold, once the write completes.
    pub fn propose(&self, events: u64, positions: &[u64; RINGS]) {
        for (i, &p) in positions.iter().enumerate() {
            self.u64(header::PROPOSED + 8 * i as u64).store(p, Relaxed);
        }
        self.u64(header::EVENTS_PROPOSED).store(events, Release);
    }

    /// On the writer, after the write completed: producers may reuse the space before `positions`.
    pub fn commit(&self, positions: &[u64; RINGS]) {
        let mut moved = false;
        for (i, &p) in positions.iter().enumerate() {
            // Unchanged positions are not written: a write takes the line from the producer.
            let at = self.u64(Self::control(i, ring::COMMITTED));
            if at.load(Relaxed) != p {
                at.store(p, Release);
                moved = true;
            }
        }
        if moved {
            COMMITS.fetch_add(1, Release);
        }
    }

    /// On the writer: the id it gave to `key` (see `journal::dict`), for a reader that
    /// recovers events which name the key without its frames. A full dictionary only costs a
    /// recovery those names.
    pub fn remember(&self, kind: u32, id: u32, key: u64, sig: u64) {
        let n = self.u64(header::DICT_LEN).load(Relaxed);
        if n >= j::DICT_ENTRIES {
            return;
        }
        let off = j::dict_offset() + n * j::DICT_ENTRY_BYTES;
        let mut e = [0u8; j::DICT_ENTRY_BYTES as usize];
        e[..4].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&id.to_le_bytes());
        e[8..16].copy_from_slice(&key.to_le_bytes());
        e[16..].copy_from_slice(&sig.to_le_bytes());
        self.bytes(off, &e);
        self.u64(header::DICT_LEN).store(n + 1, Release);
    }

    /// The trace is complete: the journal has nothing left to tell.
    pub fn remove_file(&self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }

    /// In a forked child: the parent's journal is not ours to touch.
    ///
    /// # Safety
    /// No reference into the mapping may be used afterwards.
    pub unsafe fn unmap(&self) {
        // SAFETY: per the contract; the range is the one mmap returned.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests;
