//! What every hook does around the real call. This is the hot path, top-down:
//!
//! 1. enter the per-thread guard; a nested call (the runtime calling the driver inside
//!    `cudaMalloc`) or a call from the tracer itself just runs the real function;
//! 2. run the real function; its result and out-parameters reach the caller untouched;
//! 3. describe the call (`Fields`, from the table line); failed calls are events too;
//! 4. stamp it (time, thread, device), capture the Python stack (`python`: code objects and
//!    instruction offsets) and the native stack (raw return addresses);
//! 5. hand it to the writer thread through the channel (`tracer::submit`).
//!
//! Anything that goes wrong in 3-5 is caught here: tracing switches itself off with one line on
//! stderr, and the program goes on with the real result.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpumemtrace_format::{event_flags, Op};

use crate::cuda::{C10Device, Status, C10_CUDA, SUCCESS};
use crate::guard::Guard;
use crate::record::{RawEvent, Stack};
use crate::{resolve, selftime, tracer, unwind};

/// A call of API number `api` (its index in the hook table) that allocates or frees (`op`).
// Not in the hot section: one copy per hooked function (some 30), most never called in a
// given process; what it calls (`record`, `free_without_stack`) is.
pub fn traced(api: u32, op: Op, call: impl FnOnce() -> Status, describe: impl FnOnce(Status) -> Option<Fields>) -> Status {
    let entered = selftime::mark();
    let Some(guard) = Guard::enter() else {
        return call();
    };
    if tracer::is_off() {
        return call();
    }
    // A free is ordered (stamped: order key and time) before its real call, an allocation after
    // it: then an address freed on one thread and handed out again on another is always written
    // free first (see `clock::stamp`). Free lines of the table do not read the result. A free's
    // stamp holds its ring's mark across the real call (the writer waits for it, as for any
    // stamped event not handed over yet).
    let is_free = matches!(op, Op::Free);
    if is_free {
        // Filled in place (not returned through the closure and moved on: the stamp and the
        // fields are a hundred bytes, and each move of them was a dozen instructions).
        let mut fields = None;
        let mut stamp = None;
        if catch_unwind(AssertUnwindSafe(|| {
            fields = describe(SUCCESS);
            if fields.is_some() && tracer::ensure_started() {
                stamp = Some(tracer::stamp(Some(&guard)));
            }
        }))
        .is_err()
        {
            stamp = None;
            tracer::disable("internal error while describing a free");
        }
        let calling = selftime::mark();
        let result = call();
        let returned = selftime::mark();
        if let (Some(f), Some(st)) = (&fields, &stamp) {
            if result == SUCCESS {
                // A free needs no stack (the allocation's says what the memory was for), only the
                // bit that says whether Python code freed it, as a block free. A failed free
                // keeps its stacks: a report shows where the bad free came from.
                report_panic(catch_unwind(AssertUnwindSafe(|| free_without_stack(&guard, api, f, st))));
                count_bare(entered, calling, returned);
            } else {
                let f = *f;
                let st = stamp.take();
                report_panic(catch_unwind(AssertUnwindSafe(|| {
                    record(&guard, api, result, f, st);
                })));
            }
        }
        return result;
    }
    let calling = selftime::mark();
    let result = call();
    let returned = selftime::mark();
    let recorded = catch_unwind(AssertUnwindSafe(|| {
        if let Some(fields) = describe(result) {
            let marks = record(&guard, api, result, fields, None);
            count_stacked(entered, calling, returned, marks);
        }
    }));
    report_panic(recorded);
    result
}

/// Self time of an event with stacks (see `selftime`): `marks` are `record`'s.
#[link_section = ".text.hot.gpumemtrace"]
fn count_stacked(entered: u64, calling: u64, returned: u64, (marks, python): ([u64; 4], bool)) {
    if entered == 0 || marks[0] == 0 {
        return;
    }
    let kind = if python { selftime::Kind::Python } else { selftime::Kind::Native };
    let end = selftime::mark();
    let [py, native, hand_off, _] = selftime::spans(marks);
    let after = end.saturating_sub(returned);
    let other = after.saturating_sub(py + native + hand_off);
    selftime::count(kind, [calling.saturating_sub(entered), py, native, hand_off, other]);
}

/// Self time of an event without stacks: all of it after the call is the hand-off.
#[link_section = ".text.hot.gpumemtrace"]
fn count_bare(entered: u64, calling: u64, returned: u64) {
    if entered == 0 {
        return;
    }
    let end = selftime::mark();
    selftime::count(selftime::Kind::Bare, [calling.saturating_sub(entered), 0, 0, end.saturating_sub(returned), 0]);
}

/// A caching allocator's report of one block (`table`'s `reports`): `size` > 0 hands the block
/// out, < 0 takes it back. Only GPU blocks are recorded (PyTorch reports CPU memory here too),
/// as API number `apis.0` (allocation) or `apis.1` (free); `forward` always runs, with the
/// caller's exact arguments.
#[link_section = ".text.hot.gpumemtrace"]
pub fn block(apis: (u32, u32), ptr: u64, size: i64, device: C10Device, totals: Option<(u64, u64)>, forward: impl FnOnce()) {
    let entered = selftime::mark();
    let Some(guard) = Guard::enter() else {
        return forward();
    };
    if tracer::is_off() || device.type_ != C10_CUDA || size == 0 || ptr == 0 {
        return forward();
    }
    let (allocated, reserved) = totals.unwrap_or((0, 0));
    let fields = Fields {
        addr: ptr,
        size: size.unsigned_abs(),
        stream: 0,
        extra: 0,
        device: Some(device.index as i32),
        totals: (allocated, reserved),
    };
    if size < 0 {
        // A free needs no stack: stamped before the block can be handed out again, with one bit
        // saying whether the program (not the interpreter's shutdown) freed it.
        // Filled in place, as a driver free's (see `traced`).
        let mut stamp = None;
        let mut flags = 0;
        if catch_unwind(AssertUnwindSafe(|| {
            if tracer::ensure_started() {
                stamp = Some(tracer::stamp(Some(&guard)));
                flags = python_flag(&guard);
            }
        }))
        .is_err()
        {
            stamp = None;
            tracer::disable("internal error while describing a block free");
        }
        let calling = selftime::mark();
        forward();
        let returned = selftime::mark();
        if let Some(stamp) = &stamp {
            report_panic(catch_unwind(AssertUnwindSafe(|| {
                let device = fields.device.unwrap_or(-1);
                tracer::submit(bare_event(&guard, apis.1, SUCCESS, fields, device, stamp, flags), stamp);
                count_bare(entered, calling, returned);
            })));
        }
        return;
    }
    let calling = selftime::mark();
    forward();
    let returned = selftime::mark();
    report_panic(catch_unwind(AssertUnwindSafe(|| {
        let marks = record(&guard, apis.0, SUCCESS, fields, None);
        count_stacked(entered, calling, returned, marks);
    })));
}

#[link_section = ".text.hot.gpumemtrace"]
fn free_without_stack(guard: &Guard, api: u32, f: &Fields, stamp: &tracer::Stamp) {
    let device = f.device.unwrap_or_else(resolve::current_device);
    tracer::submit(bare_event(guard, api, SUCCESS, *f, device, stamp, python_flag(guard)), stamp);
}

/// A free's flag: whether the program's Python code made it. Only the main thread's events tell
/// the Python program's end (the reader's and the aggregate writer's rule), so other threads'
/// frees skip the interpreter lookup (two calls into libpython, about 100 ns on a busy host).
#[link_section = ".text.hot.gpumemtrace"]
fn python_flag(guard: &Guard) -> u32 {
    if guard.is_main_thread() && crate::python::has_frames() {
        event_flags::PYTHON
    } else {
        0
    }
}

/// An event without stacks (`record` adds them).
#[allow(clippy::too_many_arguments)]
fn bare_event(guard: &Guard, api: u32, result: Status, f: Fields, device: i32, stamp: &tracer::Stamp, flags: u32) -> RawEvent {
    let (tid, thread_name) = guard.identity();
    RawEvent {
        seq: stamp.key,
        api,
        time_ns: stamp.time,
        tid,
        result: result as u32,
        device,
        addr: f.addr,
        size: f.size,
        stream: f.stream,
        extra: f.extra,
        total_allocated: f.totals.0,
        total_reserved: f.totals.1,
        flags,
        frames: Stack { key: 0, frames: Vec::new() },
        py: None,
        py_key: 0,
        py_tstate: false,
        thread_name,
    }
}

#[inline(always)]
fn report_panic(recorded: std::thread::Result<()>) {
    if let Err(payload) = recorded {
        panicked(payload);
    }
}

#[cold]
#[inline(never)]
fn panicked(payload: Box<dyn std::any::Any + Send>) {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracer::disable(&format!("internal error while recording a call ({what})"));
}

/// Records the event; returns the self-time marks (see `selftime`) taken before the Python
/// stack, the native stack, the hand-off and after it (all 0 when not measuring), and whether
/// the event has a Python stack.
#[link_section = ".text.hot.gpumemtrace"]
fn record(guard: &Guard, api: u32, result: Status, f: Fields, stamp: Option<tracer::Stamp>) -> ([u64; 4], bool) {
    if !tracer::ensure_started() {
        return ([0; 4], false);
    }
    let device = match f.device {
        Some(d) => d,
        None => resolve::current_device(),
    };
    let started = selftime::mark();
    // Python frames first: cheap, and they name the code objects the writer must describe.
    // Like native stacks, a Python stack crosses the channel once per thread; after that its key
    // alone (no allocation here, none freed on the writer's thread).
    let py = crate::python::capture();
    let (py_key, py_tstate) = py.as_ref().map_or((0, false), |k| (k.key, k.has_tstate));
    let flags = if py_key != 0 { event_flags::PYTHON } else { 0 };
    let py = py.and_then(|k| k.full);
    let known: Vec<(u64, u64)> =
        py.as_ref().map(|p| p.new_codes.iter().map(|c| (c.code, c.sig)).collect()).unwrap_or_default();
    let py = py.map(Box::new);
    // With a Python stack, the native one ends where the interpreter begins (see
    // `Config::interpreter_frames`).
    let stop = if py_key != 0 && !tracer::interpreter_frames() { crate::python::interpreter_code() } else { &[] };
    let python_done = selftime::mark();
    let frames = unwind::capture(tracer::max_frames(), stop);
    let native_done = selftime::mark();
    // An allocation is stamped now, after its stacks: any time after its real call returned
    // orders it (the program cannot free the memory before the hook returns), and its ring's
    // mark then spans only the hand-over.
    let stamp = stamp.unwrap_or_else(|| tracer::stamp(Some(guard)));
    let event = RawEvent { frames, py, py_key, py_tstate, ..bare_event(guard, api, result, f, device, &stamp, flags) };
    tracer::submit(event, &stamp);
    drop(stamp);
    if !known.is_empty() {
        crate::python::remember(&known);
    }
    ([started, python_done, native_done, selftime::mark()], py_key != 0)
}

/// What a call did, as the table line describes it.
#[derive(Clone, Copy)]
pub struct Fields {
    addr: u64,
    size: u64,
    stream: u64,
    extra: u64,
    /// `None`: ask the driver for the calling thread's current device.
    device: Option<i32>,
    /// An allocator's own (allocated, reserved) counters after the call (blocks only).
    totals: (u64, u64),
}

/// An allocation (possibly failed: then `addr` is 0 and `size` is what was asked for).
pub fn alloc(addr: u64, size: u64) -> Option<Fields> {
    Some(Fields { addr, size, stream: 0, extra: 0, device: None, totals: (0, 0) })
}

/// A free; freeing a null pointer is a no-op (often used just to initialise CUDA): no event.
pub fn free(addr: u64) -> Option<Fields> {
    if addr == 0 {
        return None;
    }
    Some(Fields { addr, size: 0, stream: 0, extra: 0, device: None, totals: (0, 0) })
}

/// Builders for the optional parts, chainable on `Option<Fields>` so table lines stay short.
pub trait FieldsExt {
    fn stream(self, s: *mut c_void) -> Self;
    fn extra(self, v: u64) -> Self;
    fn size(self, v: u64) -> Self;
    fn device(self, d: i32) -> Self;
    /// Host memory belongs to no device.
    fn host(self) -> Self;
}

impl FieldsExt for Option<Fields> {
    fn stream(self, s: *mut c_void) -> Self {
        self.map(|f| Fields { stream: s as u64, ..f })
    }
    fn extra(self, v: u64) -> Self {
        self.map(|f| Fields { extra: v, ..f })
    }
    fn size(self, v: u64) -> Self {
        self.map(|f| Fields { size: v, ..f })
    }
    fn device(self, d: i32) -> Self {
        self.map(|f| Fields { device: Some(d), ..f })
    }
    fn host(self) -> Self {
        self.device(-1)
    }
}

/// Pointer-sized out-parameters: device pointers, host pointers, VMM handles.
pub trait Addr: Copy {
    fn addr(self) -> u64;
}
impl Addr for u64 {
    fn addr(self) -> u64 {
        self
    }
}
impl Addr for *mut c_void {
    fn addr(self) -> u64 {
        self as u64
    }
}

/// Reads an out-parameter, only if the call succeeded (else it may be garbage); 0 otherwise.
///
/// # Safety
/// `p` must be null or the out-pointer the caller passed to a call that returned `r`.
pub unsafe fn out<T: Addr>(r: Status, p: *mut T) -> u64 {
    if r != SUCCESS || p.is_null() {
        return 0;
    }
    // SAFETY: the real call succeeded, so it wrote a value through this non-null pointer.
    unsafe { p.read() }.addr()
}

