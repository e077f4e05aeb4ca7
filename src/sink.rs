//! The trace file's end of the writer: a batch of encoded records is compressed, written, and
//! then the journal is told that its entries are in the trace (propose, write, commit: see
//! `journal` in the format crate), batch after batch, in order.
//!
//! Inline on the writer thread, or on a thread of its own: zstd takes about a quarter of the
//! writer's instructions an event, and while it runs the writer cannot read the rings, so with
//! many busy threads the hooks wait for room. Beside the writer, the compression of one batch
//! overlaps the reading and encoding of the next. That thread is started only once the writer is
//! busy (it writes before the flush interval is up: a batch came full, or a ring is filling),
//! only where there are cores to spare (at least four), and only when the body is compressed;
//! `GPUMEMTRACE_WRITE_THREAD=1`/`0` overrides.
//!
//! The journal's protocol is unchanged: the one thread that writes also proposes and commits,
//! batch by batch, so a reader never sees a proposal ahead of a write that is not the next.
//! The batch thread never takes the writer's lock (the writer waits on the sink's, while
//! holding its own): no lock order to break.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use gpumemtrace_format as fmt;

pub use crate::batch::{Batch, Body};
use crate::batch::Items;
use crate::ring::Journal;

/// Batches handed over and not written yet, at most (bounds the memory they hold: two full
/// batches of items, their encoded and compressed copies, and the spare bodies, a few MiB).
const QUEUED_MAX: usize = 2;

/// The writing end itself, owned by whichever thread writes.
struct Out {
    file: File,
    /// The trace's device and inode: the descriptor is checked against them before each write.
    identity: (u64, u64),
    path: PathBuf,
    zstd: Option<fmt::Compressor>,
    /// Compressed bytes before they are written.
    out: Vec<u8>,
    /// Encodes the events of batches of items (see `batch`), into `encoded`.
    enc: fmt::Encoder,
    encoded: Vec<u8>,
    journal: Option<&'static Journal>,
    /// The output took nothing for `output::PATIENCE` (an unread FIFO): no write waits again.
    gave_up: bool,
    /// `events` of the last batch given to it: a batch's own events are the difference.
    handed: u64,
}

pub struct Sink {
    how: How,
    /// Events in the batches written so far (the rest is queued, or was lost with a write: a
    /// batch written after a failed one does not count the failed one's).
    written: Arc<AtomicU64>,
    /// `GPUMEMTRACE_WRITE_THREAD`: `Some(on)` forced, `None` decided by the host.
    thread: Option<bool>,
}

/// The writing end, passed to the batch thread through a slot it empties once it runs.
type Slot = Arc<Mutex<Option<Box<Out>>>>;

enum How {
    Inline(Box<Out>),
    /// The batch thread was started but has not taken the end yet: until it does, batches are
    /// written inline from the slot. A new thread may be held up at its start for as long as
    /// the host likes: std's start registers a thread-local destructor, which takes the
    /// loader's lock, and a host allocating in a library constructor holds that lock inside
    /// `dlopen` while the tracer starts and writes the trace's first batch. Waiting for the
    /// thread there was a deadlock.
    Starting(Slot, Arc<Shared>),
    Beside(Arc<Shared>),
    /// Only while moving the end from one to the other.
    Moving,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a batch is queued, and when one is done.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Batch>,
    /// The batch thread is writing one (taken off the queue).
    busy: bool,
    /// The first failed write the writer was not told of yet.
    error: Option<io::Error>,
    /// Bodies of written batches, for the writer to fill again.
    spare: Vec<Body>,
}

impl Sink {
    /// The trace's end: `file` (its header already written) at `path`.
    pub fn new(
        file: File,
        identity: (u64, u64),
        path: PathBuf,
        zstd: Option<fmt::Compressor>,
        journal: Option<&'static Journal>,
        thread: Option<bool>,
    ) -> Sink {
        let out = Out {
            file,
            identity,
            path,
            zstd,
            out: Vec::new(),
            enc: fmt::Encoder::new(),
            encoded: Vec::new(),
            journal,
            gave_up: false,
            handed: 0,
        };
        Sink { how: How::Inline(Box::new(out)), written: Arc::new(AtomicU64::new(0)), thread }
    }

    /// Events in the batches written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Acquire)
    }

    /// Writes `batch` and returns an empty body for the next one: bytes while the writer
    /// encodes (inline), items once the events are encoded here. Inline: written now.
    /// Beside: queued (waiting while `QUEUED_MAX` are), and written by now when `wait`. An
    /// error is a failed write: this batch's (inline, or beside with `wait`) or an earlier one's.
    /// `busy`: the writer writes before its time, because the hooks fill the rings faster.
    pub fn write(&mut self, batch: Batch, wait: bool, busy: bool) -> io::Result<Body> {
        if let How::Inline(out) = &self.how {
            if self.should_move(busy, out) {
                self.move_beside();
            }
        }
        if let How::Starting(slot, shared) = &self.how {
            let mut end = lock(slot);
            match end.as_mut() {
                // Written inline until the thread has the end; what comes back is items either way.
                Some(out) => {
                    return Sink::write_inline_to(&self.written, out, batch).map(|body| match body {
                        Body::Items(_) => body,
                        Body::Bytes(_) => Body::Items(Items::default()),
                    })
                }
                None => {
                    // Taken: the thread runs, and every batch before this one was written.
                    let shared = shared.clone();
                    drop(end);
                    self.how = How::Beside(shared);
                }
            }
        }
        match &mut self.how {
            How::Inline(out) => Sink::write_inline_to(&self.written, out, batch),
            How::Beside(shared) => {
                let mut s = lock(&shared.state);
                while s.queue.len() >= QUEUED_MAX {
                    s = wait_on(&shared.changed, s);
                }
                s.queue.push_back(batch);
                shared.changed.notify_all();
                if wait {
                    while !s.queue.is_empty() || s.busy {
                        s = wait_on(&shared.changed, s);
                    }
                }
                let body = s.spare.pop().unwrap_or_else(|| Body::Items(Items::default()));
                match s.error.take() {
                    Some(e) => Err(e),
                    None => Ok(body),
                }
            }
            How::Starting(..) | How::Moving => Err(io::Error::other("the trace's writing end was lost")),
        }
    }

    /// Written now, on the calling thread; the body comes back emptied.
    fn write_inline_to(written: &AtomicU64, out: &mut Out, batch: Batch) -> io::Result<Body> {
        let r = out.write_counted(&batch, written);
        r.map(|_| batch.body.emptied())
    }

    /// A busy writer (the hooks fill the rings before the flush interval is up) on a host with
    /// cores to spare moves the compression beside it. Forced either way by
    /// `GPUMEMTRACE_WRITE_THREAD`.
    fn should_move(&self, busy: bool, out: &Out) -> bool {
        // Not while the process ends (the exit's last batches; perhaps inside a signal handler).
        if crate::output::is_exiting() {
            return false;
        }
        match self.thread {
            Some(on) => on,
            None => busy && out.zstd.is_some() && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4),
        }
    }

    /// Starts the batch thread and offers it the writing end; batches are written inline until
    /// it has taken it (`How::Starting`). Should the thread not start, they go on being
    /// written inline.
    #[cold]
    fn move_beside(&mut self) {
        let How::Inline(out) = std::mem::replace(&mut self.how, How::Moving) else { return };
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new() });
        let (theirs, written) = (shared.clone(), self.written.clone());
        // The end is handed over through a slot the thread empties: if the thread cannot start,
        // it comes back from the slot.
        let slot = Arc::new(Mutex::new(Some(out)));
        let their_slot = slot.clone();
        let started = crate::thread::spawn_without_signals("gpumemtrace-out", move || {
            let Some(out) = lock(&their_slot).take() else { return };
            batch_loop(*out, &theirs, &written);
        });
        self.how = match started {
            Ok(()) => How::Starting(slot, shared),
            Err(_) => match lock(&slot).take() {
                Some(out) => How::Inline(out),
                None => How::Beside(shared), // the thread got it after all
            },
        };
    }
}

/// The batch thread: writes queued batches in order, for the life of the process.
fn batch_loop(mut out: Out, shared: &Shared, written: &AtomicU64) {
    loop {
        let batch = {
            let mut s = lock(&shared.state);
            while s.queue.is_empty() {
                s = wait_on(&shared.changed, s);
            }
            s.busy = true;
            s.queue.pop_front().expect("a queued batch")
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| out.write_counted(&batch, written)))
            .unwrap_or_else(|_| Err(io::Error::other("internal error while writing the trace")));
        let mut s = lock(&shared.state);
        s.busy = false;
        if let Err(e) = r {
            s.error.get_or_insert(e);
        }
        // Only items come back to the writer: a bytes body (one handed over before the move)
        // is not what it fills now.
        if s.spare.len() < QUEUED_MAX && matches!(batch.body, Body::Items(_)) {
            s.spare.push(batch.body.emptied());
        }
        shared.changed.notify_all();
    }
}

impl Out {
    /// `write`, adding the batch's own events to `written` when it is in the trace.
    fn write_counted(&mut self, b: &Batch, written: &AtomicU64) -> io::Result<()> {
        let own = b.events.saturating_sub(self.handed);
        self.handed = self.handed.max(b.events);
        let r = self.write(b);
        if r.is_ok() {
            written.fetch_add(own, Release);
        }
        r
    }

    /// Proposes, writes and commits one batch (an empty one only commits).
    fn write(&mut self, b: &Batch) -> io::Result<()> {
        if b.body.is_empty() {
            if let Some(jn) = self.journal {
                jn.commit(&b.at);
            }
            return Ok(());
        }
        if let Some(jn) = self.journal {
            jn.propose(b.events, &b.at);
        }
        if self.gave_up {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the output stopped taking data"));
        }
        self.own_descriptor()?;
        let mut encoded = std::mem::take(&mut self.encoded);
        let bytes: &[u8] = match &b.body {
            Body::Bytes(bytes) => bytes,
            Body::Items(items) => {
                items.encode(&mut self.enc, &mut encoded);
                &encoded
            }
        };
        let r = match &mut self.zstd {
            Some(z) => {
                self.out.clear();
                // A frame starts with where the event deltas stand, so that a reader that lost
                // the frame before can go on from it.
                let mut sync = Vec::new();
                if z.at_frame_start() {
                    b.start.sync(&mut sync);
                }
                let r = z.compress_parts(&[&sync, bytes], &mut self.out, b.last).and_then(|_| crate::output::write_all(&self.file, &self.out));
                if r.is_err() {
                    let _ = z.abandon_frame();
                }
                r
            }
            None => crate::output::write_all(&self.file, bytes),
        };
        self.encoded = encoded;
        match r {
            Ok(()) => {
                if let Some(jn) = self.journal {
                    jn.commit(&b.at);
                }
                Ok(())
            }
            Err(e) => {
                self.gave_up |= e.kind() == io::ErrorKind::TimedOut;
                Err(e)
            }
        }
    }

    /// Makes sure the descriptor still is the trace's: a host may close every descriptor it did
    /// not open (daemons, process pools) and get the same number back for a file of its own.
    /// Then the number is the host's, never written or closed by us, and the trace is opened
    /// again by its path (appending, no symlink followed, the same inode or nothing).
    fn own_descriptor(&mut self) -> io::Result<()> {
        if identity(&self.file) == Some(self.identity) {
            return Ok(());
        }
        use std::os::fd::{FromRawFd, IntoRawFd};
        let f = crate::output::reopen(&self.path)?;
        if identity(&f) != Some(self.identity) {
            return Err(io::Error::other("the trace file was replaced"));
        }
        let host = std::mem::replace(&mut self.file, f);
        let _ = host.into_raw_fd(); // the host's now: not ours to close
        // A descriptor far above the ones hosts reuse first.
        // SAFETY: F_DUPFD_CLOEXEC on our own descriptor; the duplicate replaces it.
        let high = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&self.file), libc::F_DUPFD_CLOEXEC, 512) };
        if high >= 0 {
            // SAFETY: `high` is a fresh descriptor we own.
            self.file = unsafe { File::from_raw_fd(high) };
        }
        Ok(())
    }
}

/// The device and inode of an open file: what tells our descriptor from a reused number.
pub fn identity(f: &File) -> Option<(u64, u64)> {
    crate::output::identity(std::os::fd::AsRawFd::as_raw_fd(f))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait_on<'a>(cv: &Condvar, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    cv.wait(g).unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::RINGS;

    /// What the trace holds is counted batch by batch: a batch lost to a failed write stays
    /// uncounted when a later one is written (the exit's "N of M events were not written").
    #[test]
    fn a_lost_batch_stays_lost_in_the_count() {
        let path = std::env::temp_dir().join(format!("gpumemtrace-sink-test-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        let id = identity(&file).unwrap();
        let mut out = Out {
            file,
            identity: id,
            path: path.clone(),
            zstd: None,
            out: Vec::new(),
            enc: fmt::Encoder::new(),
            encoded: Vec::new(),
            journal: None,
            gave_up: false,
            handed: 0,
        };
        let written = AtomicU64::new(0);
        let batch = |events| Batch { body: Body::Bytes(b"records".to_vec()), at: [0; RINGS], events, last: false, start: Default::default() };
        out.write_counted(&batch(10), &written).unwrap();
        assert_eq!(written.load(Relaxed), 10);
        out.gave_up = true; // the output stopped taking data: this write fails
        assert!(out.write_counted(&batch(25), &written).is_err());
        out.gave_up = false;
        out.write_counted(&batch(30), &written).unwrap();
        assert_eq!(written.load(Relaxed), 15, "10, then 5 of the last batch; the 15 lost stay out");
        out.write_counted(&Batch { body: Body::Bytes(Vec::new()), at: [0; RINGS], events: 30, last: false, start: Default::default() }, &written).unwrap();
        assert_eq!(written.load(Relaxed), 15, "a batch that only commits adds nothing");
        assert_eq!(std::fs::read(&path).unwrap(), b"recordsrecords");
        let _ = std::fs::remove_file(&path);
    }
}
