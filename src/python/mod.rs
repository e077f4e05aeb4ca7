//! Python stacks: the calling thread's CPython frames, read straight from the interpreter's
//! memory inside the hook, without the GIL.
//!
//! Why raw memory: PyTorch (and every `ctypes` call) releases the GIL around the call that
//! reaches `cudaMalloc`, so the C API (which needs the GIL) cannot be used, and taking the GIL
//! inside an allocator lock can deadlock. The thread's own frames still hang off its thread
//! state and cannot change while the thread sits in our hook, so reading them is race-free.
//!
//! - Detection (`detect`): `PyGILState_GetThisThreadState` etc. through the real `dlsym` with
//!   `RTLD_DEFAULT` (a python executable exports them; so does a libpython loaded globally).
//!   Retried at most once a second while no interpreter is found (embedding may load it late).
//!   Supported: CPython 3.10 to 3.13 with the default (GIL) build. Anything else gets native
//!   stacks only, with one notice (stderr + a Notice record).
//! - Per event (`capture`): the thread state (thread-specific storage, no GIL), then the frame
//!   chain with per-version offsets (3.13: from `_Py_DebugOffsets` in `_PyRuntime`), at most
//!   [`MAX_PY_FRAMES`] frames, every pointer checked (non-null, aligned, user space) and every
//!   code object's type compared with `PyCode_Type`. A frame is (code pointer, instruction
//!   byte offset, entry flag).
//! - Code objects: the first time the process sees one (a lock-free cache keyed by address and
//!   a signature against address reuse: its number from 3.12, else its name, file, first line
//!   and line table; `code`), the hook copies
//!   what the writer needs (names, file, first line, a copy of the line table) while the frame
//!   keeps it alive. Lines are computed offline by the CLI.
//!
//! Offsets were derived from the CPython headers (3.10.13, 3.11.7, 3.12.1, 3.13.0) with a
//! `offsetof` probe compiled with `Py_BUILD_CORE`; 3.13's come from the interpreter itself.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::Mutex;

use once_cell::sync::OnceCell;

use crate::pylayout::{debug_offsets, parse_version, plausible, read, Layout};

mod code;
mod walk;
use walk::{current_frame, walk};
use crate::record::{PyCapture, RawPyFrame};
use crate::resolve::dlsym_quiet;
use crate::stackkey::Lanes;

/// Deepest Python stack recorded (innermost frames are kept).
pub const MAX_PY_FRAMES: usize = 256;
/// Longest string copied from a code object (characters).
const MAX_STR: usize = 4096;
/// Largest line table copied (bytes); a longer one is cut (later lines then read as unknown).
const MAX_LINETABLE: usize = 256 * 1024;

/// Frame flag: the first frame its interpreter-loop invocation ran.
pub const ENTRY: u8 = 1;

/// 64-bit key of a Python stack (0 only for no frames), as the native stacks' (`stackkey::hash`).
#[link_section = ".text.hot.gpumemtrace"]
pub fn stack_key(frames: &[RawPyFrame]) -> u64 {
    // Hashed as `key_going_on` hashes, outermost frame first; no state kept (nothing allocated:
    // this also serves a nested call, from a signal handler say).
    crate::stackkey::hash_groups(3 * frames.len(), frames.iter().rev().map(words))
}

/// A frame's words, one to a lane of the stack's key.
#[inline(always)]
fn words(f: &RawPyFrame) -> [u64; 3] {
    [f.code, f.sig, (f.instr as u64) << 8 | f.flags as u64]
}

/// [`stack_key`] of `frames`, hashed from the outermost frame in: `partials[j]` holds the state
/// after the `j` outermost frames of the thread's last stack, the first `shared` of which are
/// `frames`' too, so only the frames inside them are hashed. Leaves `partials` describing
/// `frames`.
#[link_section = ".text.hot.gpumemtrace"]
fn key_going_on(frames: &[RawPyFrame], shared: usize, partials: &mut Vec<Lanes<3>>) -> u64 {
    let shared = shared.min(frames.len()).min(partials.len().saturating_sub(1));
    partials.truncate(shared + 1);
    if partials.is_empty() {
        partials.push(Lanes::new());
    }
    let mut lanes = partials[shared];
    for f in frames[..frames.len() - shared].iter().rev() {
        lanes.add(words(f));
        partials.push(lanes);
    }
    lanes.finish(3 * frames.len())
}

type GetTstate = unsafe extern "C" fn() -> *mut c_void;
type IsInitialized = unsafe extern "C" fn() -> i32;

struct Interp {
    layout: Layout,
    get_tstate: GetTstate,
    is_initialized: IsInitialized,
    /// The flag `is_initialized` reads, where its code says (see `flag_read_by`).
    initialized_flag: Option<u64>,
    code_type: u64,
    unicode_type: u64,
    bytes_type: u64,
}

const UNKNOWN: u8 = 0;
const READY: u8 = 1;
const NONE: u8 = 2;

#[link_section = "gpumemtrace_hot"]
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static INTERP: OnceCell<Interp> = OnceCell::new();
static LAST_LOOK_NS: AtomicU64 = AtomicU64::new(0);
#[link_section = "gpumemtrace_hot"]
static ENABLED: AtomicBool = AtomicBool::new(true);
static NOTICE: Mutex<Option<String>> = Mutex::new(None);
static HAS_NOTICE: AtomicBool = AtomicBool::new(false);

#[link_section = "gpumemtrace_hot"]
static INTERPRETER_CODE: OnceCell<Vec<(u64, u64)>> = OnceCell::new();

/// The address ranges of the object holding the interpreter (libpython, or the `python`
/// executable it is linked into); empty until an interpreter is found.
#[inline]
pub fn interpreter_code() -> &'static [(u64, u64)] {
    if let Some(c) = INTERPRETER_CODE.get() {
        return c;
    }
    interpreter_code_first()
}

#[cold]
fn interpreter_code_first() -> &'static [(u64, u64)] {
    let Some(interp) = INTERP.get() else { return &[] };
    let here = interp.get_tstate as usize as u64;
    INTERPRETER_CODE.get_or_init(|| {
        crate::modules::loaded_objects().into_iter().find(|o| o.contains(here)).map(|o| o.segments).unwrap_or_default()
    })
}

/// `GPUMEMTRACE_PYTHON=0` turns capture off (set once when tracing starts).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Relaxed);
}

/// A notice for the trace (unsupported interpreter), taken once by the writer.
pub fn take_notice() -> Option<String> {
    if !HAS_NOTICE.load(Relaxed) {
        return None;
    }
    HAS_NOTICE.store(false, Relaxed);
    NOTICE.lock().unwrap_or_else(|e| e.into_inner()).take()
}

fn notice(msg: String) {
    eprintln!("gpumemtrace: {msg}");
    *NOTICE.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
    HAS_NOTICE.store(true, Relaxed);
}

fn sym(name: &CStr) -> *mut c_void {
    dlsym_quiet(libc::RTLD_DEFAULT, name)
}

/// The interpreter, if one is loaded and supported. Cheap after the first answer; while none is
/// found, a hook looks again only when the writer has said to (`look_again`, at most once a
/// second): the hot path reads no clock for it (a process without Python would pay one an event).
/// The looking is done in a hook, once the tracer runs (not while it starts: a malloc wrapper
/// that resolves malloc with `dlsym` would be entered from the start).
#[link_section = ".text.hot.gpumemtrace"]
fn interp() -> Option<&'static Interp> {
    match STATE.load(Acquire) {
        READY => return INTERP.get(),
        NONE => return None,
        _ => {}
    }
    if !LOOK_AGAIN.load(Relaxed) || !LOOK_AGAIN.swap(false, Relaxed) {
        return None;
    }
    look();
    INTERP.get()
}

/// Whether a hook should look for the interpreter (the first one does).
#[link_section = "gpumemtrace_hot"]
static LOOK_AGAIN: AtomicBool = AtomicBool::new(true);

/// On the writer: while no interpreter is found, lets a hook look again once a second (an
/// embedding program may load Python later).
pub fn look_again() {
    if STATE.load(Acquire) != UNKNOWN || LOOK_AGAIN.load(Relaxed) {
        return;
    }
    let now_ns = crate::clock::now_ns();
    let last = LAST_LOOK_NS.load(Relaxed);
    if now_ns.saturating_sub(last) >= 1_000_000_000 {
        LAST_LOOK_NS.store(now_ns, Relaxed);
        LOOK_AGAIN.store(true, Relaxed);
    }
}

fn look() {
    match detect() {
        Detected::Absent => {}
        Detected::Unsupported(why) => {
            if STATE.swap(NONE, AcqRel) != NONE {
                notice(format!("{why}; events get native stacks only"));
            }
        }
        Detected::Ready(i) => {
            let _ = codes(); // before any hook can look a code object up
            let _ = INTERP.set(i);
            STATE.store(READY, Release);
        }
    }
}

enum Detected {
    Absent,
    Unsupported(String),
    Ready(Interp),
}

fn detect() -> Detected {
    let get_tstate = sym(c"PyGILState_GetThisThreadState");
    let is_init = sym(c"Py_IsInitialized");
    let get_version = sym(c"Py_GetVersion");
    if get_tstate.is_null() || is_init.is_null() || get_version.is_null() {
        return Detected::Absent;
    }
    // SAFETY: Py_GetVersion takes no arguments, needs no GIL and returns a static C string.
    let version = unsafe {
        let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(get_version);
        let p = f();
        if p.is_null() {
            return Detected::Absent;
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let Some((major, minor)) = parse_version(&version) else {
        return Detected::Unsupported(format!("cannot read the Python version from {version:?}"));
    };
    let short = version.split_whitespace().next().unwrap_or("").to_owned();
    if version.contains("free-threading") || version.contains("free threading") {
        return Detected::Unsupported(format!("Python {short} is a free-threaded build, not supported for Python stacks"));
    }
    if !sym(c"_Py_PrintReferences").is_null() {
        return Detected::Unsupported(format!("Python {short} is a Py_TRACE_REFS build, not supported for Python stacks"));
    }
    let Some(mut layout) = (major == 3).then(|| Layout::for_minor(minor)).flatten() else {
        return Detected::Unsupported(format!("Python {short} is not supported for Python stacks (3.10 to 3.13 are)"));
    };
    if minor >= 13 {
        match debug_offsets(&mut layout, sym(c"_PyRuntime") as u64) {
            Ok(()) => {}
            Err(why) => return Detected::Unsupported(format!("Python {short}: {why}")),
        }
    }
    let types = [sym(c"PyCode_Type"), sym(c"PyUnicode_Type"), sym(c"PyBytes_Type")];
    if types.iter().any(|p| p.is_null()) {
        return Detected::Unsupported(format!("Python {short}: type objects not found"));
    }
    // SAFETY: both symbols are CPython functions of these signatures (no arguments).
    let (get_tstate, is_initialized) = unsafe {
        (std::mem::transmute::<*mut c_void, GetTstate>(get_tstate), std::mem::transmute::<*mut c_void, IsInitialized>(is_init))
    };
    Detected::Ready(Interp {
        layout,
        get_tstate,
        is_initialized,
        initialized_flag: flag_read_by(is_init as *const u8),
        code_type: types[0] as u64,
        unicode_type: types[1] as u64,
        bytes_type: types[2] as u64,
    })
}

/// The calling thread's Python stack as the hot path hands it on.
pub struct Keyed {
    /// [`stack_key`] of the frames (0: none).
    pub key: u64,
    pub has_tstate: bool,
    /// The frames and new code objects, when the writer must be told them: code objects it has
    /// not seen, or a stack this thread has not sent; else `None` (no allocation).
    pub full: Option<PyCapture>,
}

/// Python stack keys a thread has sent (direct-mapped: a lost slot only means the frames are
/// sent again).
const SENT: usize = 256;

/// A thread's Python capture state, in one thread-local (each lookup of one of this library's
/// thread-locals is a call into the loader).
struct Prev {
    /// The thread's previous stack and its key: an unchanged stack is neither looked up in the
    /// code cache nor hashed again, and its frames need no allocation.
    frames: Vec<RawPyFrame>,
    key: u64,
    /// The key's state after each number of `frames`' outer frames (`key_going_on`).
    partials: Vec<Lanes<3>>,
    /// The next capture's buffer.
    scratch: Vec<RawPyFrame>,
    /// Stack keys sent, for the tracer start (`clock::epoch`) in `epoch`.
    sent: [u64; SENT],
    epoch: u64,
    /// Thread-state lookups through the key (`this_thread_state_counted`), counted here rather
    /// than in a thread-local of their own: one loader call less a Python event.
    lookups: u32,
}

/// Whether this thread already sent the stack `key` (and marks it sent); `sent` belongs to the
/// tracer start `of_epoch`.
#[link_section = ".text.hot.gpumemtrace"]
fn sent_before(sent: &mut [u64; SENT], of_epoch: &mut u64, key: u64) -> bool {
    let epoch = crate::clock::epoch();
    if *of_epoch != epoch {
        *sent = [0; SENT];
        *of_epoch = epoch;
    }
    let slot = &mut sent[(key % SENT as u64) as usize];
    let was = *slot == key;
    *slot = key;
    was
}

thread_local! {
    static PREV: std::cell::RefCell<Prev> = const {
        std::cell::RefCell::new(Prev { frames: Vec::new(), key: 0, partials: Vec::new(), scratch: Vec::new(), sent: [0; SENT], epoch: 0, lookups: 0 })
    };
}

/// The calling thread's Python stack, or `None` when no supported interpreter is running. Its
/// frames come with it when the writer must be told them: a code object it has not seen, or a
/// stack this thread has not sent since the tracer started.
#[link_section = ".text.hot.gpumemtrace"]
pub fn capture() -> Option<Keyed> {
    if !ENABLED.load(Relaxed) {
        return None;
    }
    let interp = interp()?;
    // Before initialization (or after finalization) the thread-state key is not valid.
    if !initialized(interp) {
        return None;
    }
    // A thread without Python (autograd's): no frames, and the previous stack stays as the
    // hint for this thread's next walk.
    let no_python = || Some(Keyed { key: 0, has_tstate: false, full: None });
    let r = PREV.try_with(|prev| {
        let Ok(mut prev) = prev.try_borrow_mut() else { return None };
        let Prev { frames: prev_frames, key: prev_key, partials, scratch, sent, epoch, lookups } = &mut *prev;
        let tstate = this_thread_state_counted(interp, lookups);
        if tstate == 0 {
            return no_python();
        }
        scratch.clear();
        let mut out = PyCapture { frames: std::mem::take(scratch), new_codes: Vec::new() };
        let (same, shared) = if plausible(tstate, 8) {
            // SAFETY: as below.
            unsafe { walk(interp, tstate, &mut out, prev_frames) }
        } else {
            (prev_frames.is_empty(), 0)
        };
        let key = if same && *prev_key != 0 { *prev_key } else { key_going_on(&out.frames, shared, partials) };
        *prev_key = key;
        let need = !out.new_codes.is_empty() || (key != 0 && !sent_before(sent, epoch, key));
        // The frames become the previous stack; the old previous buffer is the next scratch.
        let full = if need {
            prev_frames.clone_from(&out.frames);
            *scratch = Vec::new();
            Some(out)
        } else {
            *scratch = std::mem::replace(prev_frames, out.frames);
            // Empty (else `need`): forgotten rather than dropped, which was a call to the
            // drop glue of its element type on every Python event.
            debug_assert!(out.new_codes.is_empty());
            std::mem::forget(out.new_codes);
            None
        };
        Some(Keyed { key, has_tstate: tstate != 0, full })
    });
    match r {
        Ok(Some(k)) => Some(k),
        // Thread teardown or reentry: the whole capture, sent with its frames.
        _ => {
            let tstate = this_thread_state(interp);
            if tstate == 0 {
                return no_python();
            }
            let mut out = PyCapture { frames: Vec::new(), new_codes: Vec::new() };
            if plausible(tstate, 8) {
                // SAFETY: `tstate` is this thread's live PyThreadState; the frames it leads to
                // belong to this thread, which is inside our hook, so none of them is popped or
                // freed meanwhile.
                unsafe { walk(interp, tstate, &mut out, &[]) };
            }
            Some(Keyed { key: stack_key(&out.frames), has_tstate: tstate != 0, full: Some(out) })
        }
    }
}

/// Whether the calling thread is running Python code (has a current frame), at the cost of a
/// few loads: what a free, which records no stack, says about its caller.
#[link_section = ".text.hot.gpumemtrace"]
pub fn has_frames() -> bool {
    if !ENABLED.load(Relaxed) {
        return false;
    }
    if STATE.load(Acquire) != READY {
        return false;
    }
    let Some(interp) = INTERP.get() else { return false };
    if !initialized(interp) {
        return false;
    }
    let tstate = this_thread_state(interp);
    if !plausible(tstate, 8) {
        return false;
    }
    // SAFETY: `tstate` is this thread's live thread state of the detected interpreter.
    plausible(unsafe { current_frame(&interp.layout, tstate) }, 8)
}

/// How the hooks find the interpreter's state (for self-measurement's notices), once detected.
pub fn lookups() -> Option<String> {
    let interp = INTERP.get()?;
    let key = match TSS_KEY.load(Relaxed) {
        KEY_UNKNOWN => "not looked for yet (PyGILState_GetThisThreadState)".to_owned(),
        KEY_NONE => "PyGILState_GetThisThreadState (no key, or the key disagreed once)".to_owned(),
        k => format!(
            "pthread key {k} (the lowest of {} holding it; checked against the interpreter once in {CHECK_EVERY})",
            KEY_CANDIDATES.load(Relaxed)
        ),
    };
    let flag = if interp.initialized_flag.is_some() { "its flag, read directly" } else { "Py_IsInitialized" };
    Some(format!("Python lookups: thread state by {key}; initialized by {flag}"))
}

/// Whether the interpreter is initialized: its flag read where `Py_IsInitialized` reads it, when
/// that function's code says where (a call into libpython, whose code and data lines a busy
/// host has evicted, was a quarter of a Python stack's cost there).
#[link_section = ".text.hot.gpumemtrace"]
fn initialized(interp: &Interp) -> bool {
    match interp.initialized_flag {
        // SAFETY: the address of `_PyRuntime.initialized` (an int in libpython's data), taken
        // from the instruction that `Py_IsInitialized` reads it with.
        Some(flag) => unsafe { std::ptr::read_volatile(flag as *const i32) != 0 },
        // SAFETY: Py_IsInitialized reads one runtime flag; no GIL needed.
        None => unsafe { (interp.is_initialized)() != 0 },
    }
}

/// Where `Py_IsInitialized` (at `f`) reads its flag, if its code is just that: an optional
/// `endbr64`, then `mov eax, [rip + d32]; ret` (a libpython built without semantic
/// interposition, or an interpreter linked into the executable), or `mov rax, [rip + d32]`
/// (the address of `_PyRuntime` from the GOT, filled in at load), `mov eax, [rax + d8/d32]`,
/// `ret`. Anything else (another compiler's code, a debug build) gets `None`, and the function
/// is called.
fn flag_read_by(f: *const u8) -> Option<u64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // Bytes are read one at a time up to the first that differs: each one read is then part
    // of the instructions matched so far, so inside the function.
    // SAFETY: `f` is a function's entry in a mapped, readable text segment.
    let at = |i: usize| unsafe { f.add(i).read() };
    let d32 = |i: usize| i32::from_le_bytes([at(i), at(i + 1), at(i + 2), at(i + 3)]) as i64 as u64;
    let mut i = 0;
    if at(0) == 0xF3 {
        if (at(1), at(2), at(3)) != (0x0F, 0x1E, 0xFA) {
            return None;
        }
        i = 4;
    }
    let flag = if (at(i), at(i + 1)) == (0x8B, 0x05) {
        let flag = (f as u64).wrapping_add(i as u64 + 6).wrapping_add(d32(i + 2));
        i += 6;
        flag
    } else if (at(i), at(i + 1), at(i + 2)) == (0x48, 0x8B, 0x05) {
        let slot = (f as u64).wrapping_add(i as u64 + 7).wrapping_add(d32(i + 3));
        i += 7;
        let off = match (at(i), at(i + 1)) {
            (0x8B, 0x40) => {
                i += 3;
                at(i - 1) as i8 as i64 as u64
            }
            (0x8B, 0x80) => {
                i += 6;
                d32(i - 4)
            }
            _ => return None,
        };
        if at(i) != 0xC3 || !plausible(slot, 8) {
            return None;
        }
        // SAFETY: a GOT slot of the object holding `f` (the displacement of an instruction of
        // this function), filled in by the loader before any of its code ran.
        let runtime = unsafe { read::<u64>(slot) };
        if !plausible(runtime, 8) {
            return None;
        }
        return Some(runtime.wrapping_add(off)).filter(|&a| plausible(a, 4));
    } else {
        return None;
    };
    if at(i) != 0xC3 {
        return None;
    }
    Some(flag).filter(|&a| plausible(a, 4))
}

/// The pthread key under which the interpreter keeps each thread's state, once found (see
/// `find_key`): then the state is one `pthread_getspecific`, not two nested calls into
/// libpython whose code and data lines a busy host has evicted between two events.
#[link_section = "gpumemtrace_hot"]
static TSS_KEY: AtomicU32 = AtomicU32::new(KEY_UNKNOWN);
const KEY_UNKNOWN: u32 = u32::MAX;
/// Not found, or once it disagreed with the interpreter: the interpreter's function is called.
const KEY_NONE: u32 = u32::MAX - 1;
/// How many keys held the state when the key was chosen (for `lookups`).
static KEY_CANDIDATES: AtomicU32 = AtomicU32::new(0);
/// A thread's lookups through the key are checked against the interpreter's function: its first
/// and then one in this many.
const CHECK_EVERY: u32 = 64;

thread_local! {
    static LOOKUPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's Python thread state (0: none). Only after `Py_IsInitialized` said yes.
#[link_section = ".text.hot.gpumemtrace"]
fn this_thread_state(interp: &Interp) -> u64 {
    // One thread-local access (a loader call each); a thread being torn down counts from 0,
    // which checks its lookup.
    LOOKUPS
        .try_with(|c| {
            let mut n = c.get();
            let tstate = this_thread_state_counted(interp, &mut n);
            c.set(n);
            tstate
        })
        .unwrap_or_else(|_| this_thread_state_counted(interp, &mut 0))
}

/// `this_thread_state` with the thread's count of lookups where the caller keeps it.
#[inline(always)]
fn this_thread_state_counted(interp: &Interp, lookups: &mut u32) -> u64 {
    let key = TSS_KEY.load(Relaxed);
    if key < KEY_NONE {
        // SAFETY: a key the interpreter created (see `find_key`); glibc answers null for a
        // key deleted since (the interpreter deletes it after it has stopped being initialized).
        let by_key = unsafe { libc::pthread_getspecific(key as libc::pthread_key_t) } as u64;
        let n = *lookups;
        *lookups = n.wrapping_add(1);
        if !n.is_multiple_of(CHECK_EVERY) {
            return by_key;
        }
        // SAFETY: as below.
        let tstate = unsafe { (interp.get_tstate)() } as u64;
        if tstate != by_key {
            TSS_KEY.store(KEY_NONE, Relaxed);
        }
        return tstate;
    }
    // SAFETY: PyGILState_GetThisThreadState reads thread-specific storage; no GIL needed.
    let tstate = unsafe { (interp.get_tstate)() } as u64;
    if key == KEY_UNKNOWN && tstate != 0 {
        find_key(tstate);
    }
    tstate
}

/// `PyGILState_GetThisThreadState` is `pthread_getspecific` of the key in `_PyRuntime` (3.10
/// to 3.13, pthread builds), whose offset differs by version and build. The key is found by
/// value instead: a key whose value on this thread is the state the interpreter just gave.
/// Another library may keep the state too (pybind11 keeps the main thread's under its own key,
/// created when torch is imported, after the interpreter's): the lowest such key is taken, and
/// `this_thread_state` drops it for good the first time it disagrees with the interpreter (a
/// thread's first lookup is always checked, as is one in `CHECK_EVERY`).
#[cold]
fn find_key(tstate: u64) {
    if !cfg!(target_env = "gnu") {
        // Other C libraries may not answer for keys never created.
        TSS_KEY.store(KEY_NONE, Relaxed);
        return;
    }
    // SAFETY: sysconf has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_THREAD_KEYS_MAX) }.clamp(0, 1024) as u32;
    // SAFETY: glibc answers null for a key below its maximum that was never created.
    let holding = (0..max).filter(|&k| unsafe { libc::pthread_getspecific(k as libc::pthread_key_t) } as u64 == tstate);
    let (n, lowest) = holding.fold((0, KEY_NONE), |(n, low), k| (n + 1, low.min(k)));
    KEY_CANDIDATES.store(n, Relaxed);
    TSS_KEY.store(lowest, Relaxed);
}

const CACHE: usize = 8192;
/// (code address, signature) a slot: the two words of a lookup on one cache line.
/// Allocated when an interpreter is found, not a static: 128 KiB of `.bss` here put
/// the statics every hook reads on pages of their own.
#[link_section = "gpumemtrace_hot"]
static CODES: OnceCell<Box<[(AtomicU64, AtomicU64)]>> = OnceCell::new();

fn codes() -> &'static [(AtomicU64, AtomicU64)] {
    CODES.get_or_init(|| (0..CACHE).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect())
}

fn slot(code: u64) -> usize {
    ((code >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % CACHE
}

#[link_section = ".text.hot.gpumemtrace"]
fn cache_has(code: u64, sig: u64) -> bool {
    let (key, s) = &codes()[slot(code)];
    key.load(Acquire) == code && s.load(Acquire) == sig
}

/// Marks code objects as known. Called after the event that carries them was handed over, so
/// that an event of another thread that relies on the mark is queued after it.
pub fn remember(codes_sent: &[(u64, u64)]) {
    let table = codes();
    for &(code, sig) in codes_sent {
        let (key, s) = &table[slot(code)];
        key.store(0, Release);
        s.store(sig, Release);
        key.store(code, Release);
    }
}

/// After fork the child keeps the parent's interpreter; its new trace knows no code objects.
pub fn forget_codes() {
    if let Some(table) = CODES.get() {
        for (key, _) in table.iter() {
            key.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
