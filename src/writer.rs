//! Turns events into trace records: interns stacks (each distinct stack is written once), keeps
//! the module map current, encodes with the format crate and writes the file. Runs on the
//! writer thread, or on the exiting thread once the writer thread is done.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpumemtrace_format::{self as fmt, Encoder, Record};

use crate::config::Config;
use crate::modules::{loaded_objects, Object};
use crate::table::{ALL, HOOKS};
use crate::tracer::{Msg, RawEvent, RawPhase};
use crate::unwind::Stack;

/// The identity hash, for keys that are hashes already.
#[derive(Default)]
struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// How long recorded events may sit in memory: bounds what a SIGKILL can lose.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
const FLUSH_BYTES: usize = 256 * 1024;

pub struct Writer {
    file: File,
    pub path: PathBuf,
    enc: Encoder,
    buf: Vec<u8>,
    start_ns: u64,
    /// Stack ids by the hot path's key (`unwind::Stack`): already a hash, not hashed again.
    stacks: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    /// Objects written to the trace, by (path, bias).
    modules: Vec<Object>,
    /// Addresses found in no loaded object even after a rescan (JIT code...): don't rescan.
    unmapped: HashSet<u64>,
    pub events: u64,
    pub dropped: u64,
    last_flush: Instant,
}

impl Writer {
    /// Writes the header, the process, the hook table and the current module map.
    pub fn create(file: File, path: PathBuf, start_ns: u64, config: &Config, early_phases: Vec<RawPhase>) -> io::Result<Writer> {
        let mut w = Writer {
            file,
            path,
            enc: Encoder::new(),
            buf: fmt::header().to_vec(),
            start_ns,
            stacks: HashMap::default(),
            modules: Vec::new(),
            unmapped: HashSet::new(),
            events: 0,
            dropped: 0,
            last_flush: Instant::now(),
        };
        w.put(&Record::Process(process_info(start_ns, config)));
        for (&id, hook) in ALL.iter().zip(HOOKS) {
            if let Some((kind, op)) = hook.event {
                w.put(&Record::Api(fmt::Api { id: id as u32, name: hook.name().to_owned(), kind, op }));
            }
        }
        w.rescan_modules();
        for p in early_phases {
            w.phase(p);
        }
        w.flush()?;
        Ok(w)
    }

    pub fn message(&mut self, msg: Msg) -> io::Result<()> {
        match msg {
            Msg::Event(ev) => self.event(ev),
            Msg::Phase(p) => {
                self.phase(p);
                Ok(())
            }
        }
    }

    fn phase(&mut self, p: RawPhase) {
        let time_ns = p.time_ns.saturating_sub(self.start_ns);
        self.put(&Record::Phase(fmt::Phase { time_ns, tid: p.tid, op: p.op, name: p.name }));
    }

    fn put(&mut self, rec: &Record) {
        self.enc.encode(rec, &mut self.buf);
    }

    /// Encodes one event (and its stack and modules, the first time they are seen).
    pub fn event(&mut self, ev: RawEvent) -> io::Result<()> {
        let stack = self.intern(ev.frames);
        self.put(&Record::Event(fmt::Event {
            api: ev.api,
            time_ns: ev.time_ns.saturating_sub(self.start_ns),
            tid: ev.tid,
            stack,
            result: ev.result,
            device: ev.device,
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            extra: ev.extra,
            pystack: 0,
        }));
        self.events += 1;
        if self.buf.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn intern(&mut self, stack: Stack) -> u32 {
        if stack.key == 0 {
            return 0;
        }
        if let Some(&id) = self.stacks.get(&stack.key) {
            return id;
        }
        let frames = stack.frames;
        if frames.is_empty() {
            return 0; // its first event was lost (counted as dropped)
        }
        // A new stack may run through a library loaded since the last scan.
        if frames.iter().any(|&a| !self.mapped(a)) {
            self.rescan_modules();
            for &a in &frames {
                if !self.mapped(a) {
                    self.unmapped.insert(a);
                }
            }
        }
        let id = self.stacks.len() as u32 + 1;
        self.put(&Record::Stack(fmt::Stack { id, frames }));
        self.stacks.insert(stack.key, id);
        id
    }

    fn mapped(&self, addr: u64) -> bool {
        self.unmapped.contains(&addr) || self.modules.iter().any(|m| m.contains(addr))
    }

    fn rescan_modules(&mut self) {
        for obj in loaded_objects() {
            if self.modules.iter().any(|m| m.path == obj.path && m.bias == obj.bias) {
                continue;
            }
            let rec = fmt::Module {
                id: self.modules.len() as u32 + 1,
                bias: obj.bias,
                start: obj.start(),
                end: obj.end(),
                path: obj.path.clone(),
                build_id: obj.build_id.clone(),
            };
            self.put(&Record::Module(rec));
            self.modules.push(obj);
        }
    }

    pub fn notice(&mut self, msg: &str) {
        self.put(&Record::Notice(msg.to_owned()));
    }

    /// Counters; `final_` marks a cleanly finished trace.
    pub fn stats(&mut self, final_: bool) {
        let s = fmt::Stats { events: self.events, dropped: self.dropped, final_ };
        self.put(&Record::Stats(s));
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        if self.buf.is_empty() {
            return Ok(());
        }
        let r = write_all_without_sigxfsz(&mut self.file, &self.buf);
        self.buf.clear();
        r
    }

    pub fn flush_if_due(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() && self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()
        } else {
            Ok(())
        }
    }
}

/// Writes `buf`, but never lets the write kill the host: past RLIMIT_FSIZE the kernel sends
/// SIGXFSZ, whose default action ends the process. With the signal blocked the write fails with
/// EFBIG instead; the signal our write raised is consumed, one the host had pending is left.
fn write_all_without_sigxfsz(file: &mut File, buf: &[u8]) -> io::Result<()> {
    // SAFETY: signal-mask calls on local sets; the previous mask is restored before returning.
    unsafe {
        let mut xfsz: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut xfsz);
        libc::sigaddset(&mut xfsz, libc::SIGXFSZ);
        libc::pthread_sigmask(libc::SIG_BLOCK, &xfsz, &mut old);
        libc::sigpending(&mut pending);
        let was_pending = libc::sigismember(&pending, libc::SIGXFSZ) == 1;
        let r = file.write_all(buf);
        libc::sigpending(&mut pending);
        if !was_pending && libc::sigismember(&pending, libc::SIGXFSZ) == 1 {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&xfsz, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

fn process_info(start_ns: u64, config: &Config) -> fmt::Process {
    let args = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let realtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let monotonic = crate::tracer::now_ns();
    fmt::Process {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        start_monotonic_ns: start_ns,
        // Realtime at the moment tracing started (monotonic start shifted to realtime).
        start_realtime_ns: realtime.saturating_sub(monotonic.saturating_sub(start_ns)),
        exe,
        args,
        max_frames: config.max_frames as u32,
        rank: config.rank,
        local_rank: config.local_rank,
    }
}
