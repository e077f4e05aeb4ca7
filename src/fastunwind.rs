//! The fast native unwinder (x86-64): DWARF CFI from each loaded object's `.eh_frame_hdr` /
//! `.eh_frame`, read in place from the mapped image (no copies, no files), evaluated by the
//! `framehop` crate, whose per-thread cache keeps the unwind rule of every return address seen.
//! A warm stack costs a few ns a frame instead of libgcc's ~100.
//!
//! Safety rules (a wrong or crashing unwinder is worse than a slow one):
//! - every stack read is bounds-checked against the calling thread's stack (`pthread_getattr_np`);
//! - every code address must lie in an executable segment of a known object; an address in no
//!   known object ends the stack there, as libgcc does for code without unwind info (after the
//!   module list is re-read, if the loader's counters say objects were added since);
//! - unwind data is read from mapped images, so a `dlclose` (hooked here: it only raises a flag)
//!   makes the next capture re-read the module list before using any of it;
//! - whenever the fast path cannot answer safely (no stack bounds, a rebuild in progress in
//!   another thread, too many rebuilds), the caller falls back to the `backtrace` crate.
//!
//! Lock-free on the warm path: the module snapshot is an immutable, leaked object behind an
//! atomic pointer (replaced, never freed, at most `MAX_REBUILDS` times); the rule cache is
//! per thread.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::ops::Deref;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use crate::walkmemo::{classify, BpUse, Memo, Memos, Walked, Want};

/// A byte range of a mapped object image.
#[derive(Clone, Copy)]
struct Mapped {
    ptr: *const u8,
    len: usize,
}
// SAFETY: read-only views of mapped images; a snapshot holding them is replaced (and the flag
// raised by our `dlclose`) before an unloaded image's data could be used.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}
impl Default for Mapped {
    fn default() -> Self {
        Mapped { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 }
    }
}
impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside a PT_LOAD segment of a loaded object (see `build`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

struct Snapshot {
    unwinder: UnwinderX86_64<Mapped>,
    /// Executable segments of every loaded object, sorted by start.
    code: Vec<(u64, u64)>,
    /// The loader's `dlpi_adds` / `dlpi_subs` when the snapshot was built.
    adds: u64,
    subs: u64,
}

impl Snapshot {
    /// The executable segment holding `a`.
    fn code_range(&self, a: u64) -> Option<(u64, u64)> {
        let i = self.code.partition_point(|&(s, _)| s <= a);
        (i > 0 && a < self.code[i - 1].1).then(|| self.code[i - 1])
    }
}

#[link_section = "gpumemtrace_hot"]
static SNAPSHOT: AtomicPtr<Snapshot> = AtomicPtr::new(null_mut());
/// Raised by `dlclose`: objects may have been unmapped, the snapshot must not be used.
#[link_section = "gpumemtrace_hot"]
static STALE: AtomicBool = AtomicBool::new(false);
static REBUILDS: AtomicUsize = AtomicUsize::new(0);
static BUILDING: Mutex<()> = Mutex::new(());
/// Snapshots are leaked (a thread may still read an old one): bound how many.
const MAX_REBUILDS: usize = 256;

/// Addresses in no loaded object even after a rebuild (JIT code, a stack's garbage end): a
/// per-thread direct-mapped set, so that they do not cost a loader query, or a rebuild, each time.
const NOWHERE: usize = 64;

thread_local! {
    /// ...for the snapshot (by address) they were found missing from: a new snapshot may know them.
    static NOWHERE_SEEN: Cell<([u64; NOWHERE], usize)> = const { Cell::new(([0; NOWHERE], 0)) };
    static THREAD: RefCell<Option<Box<PerThread>>> = const { RefCell::new(None) };
}

/// Why the fast path gave no answer; the caller uses the `backtrace` crate instead.
#[derive(Debug)]
pub struct Unavailable;


/// framehop's rule cache is direct-mapped with 509 slots (`address % 509`). PyTorch's stacks
/// run through thousands of distinct return addresses per training step (every op has its own
/// dispatcher chain), so one cache thrashes and each miss costs a rule lookup and a CFI
/// evaluation (hundreds of ns a frame). `WAYS` caches indexed by the next bits of the address
/// act as one direct-mapped cache of `WAYS * 509` slots: two addresses share a slot only when
/// they are equal modulo `WAYS * 509`.
const WAYS: usize = 16;
const SLOTS: u64 = 509;

struct Caches(Box<[CacheX86_64; WAYS]>);

impl Caches {
    fn new() -> Caches {
        Caches(Box::new(std::array::from_fn(|_| CacheX86_64::new())))
    }
    fn for_address(&mut self, a: u64) -> &mut CacheX86_64 {
        &mut self.0[((a / SLOTS) % WAYS as u64) as usize]
    }
}

/// Frames walked by rule (not taken from the memo), and how many of them missed the rule cache:
/// reported in the trace, so a thrashing cache shows.
pub static WALKED: AtomicU64 = AtomicU64::new(0);
pub static MISSED: AtomicU64 = AtomicU64::new(0);

struct PerThread {
    caches: Caches,
    /// For the poisoned second unwind of a frame whose rule missed `caches` (see `classify`).
    scratch: Box<CacheX86_64>,
    memos: Memos,
    next: Memo,
    /// Not yet added to `WALKED` / `MISSED` (added in batches: no shared cache line per event).
    walked: u64,
    missed: u64,
    /// This thread's stack: [low, high); (0, 0) until found. Kept here, not in a thread-local
    /// of its own: each thread-local of this library is a call into the loader.
    stack: (u64, u64),
}

/// Return addresses of the current call stack, innermost first, starting at the first frame
/// outside `skip` (the tracer's own segments), at most `max`, ending at the first frame inside
/// `stop` (the interpreter, when its own stack replaces the rest). Returns their key
/// (`stackkey::hash`). A walk taken whole from memory fills `frames` only if `wanted(key)` (else
/// it stays empty).
#[inline(never)]
#[link_section = ".text.hot.gpumemtrace"]
pub fn capture(frames: &mut Vec<u64>, max: usize, skip: &[(u64, u64)], stop: &[(u64, u64)], wanted: impl FnOnce(u64) -> bool) -> Result<u64, Unavailable> {
    let (pc, sp, bp) = registers();
    let mut snap = snapshot()?;
    let mut rebuilt = false;
    THREAD
        .try_with(|c| {
            let mut c = c.try_borrow_mut().map_err(|_| Unavailable)?;
            let t = c.get_or_insert_with(|| {
                Box::new(PerThread {
                    caches: Caches::new(),
                    scratch: Box::new(CacheX86_64::new()),
                    memos: Memos::new(),
                    next: Memo::default(),
                    walked: 0,
                    missed: 0,
                    stack: (0, 0),
                })
            });
            if t.stack.1 == 0 {
                t.stack = stack_bounds().ok_or(Unavailable)?;
            }
            let (lo, hi) = t.stack;
            if sp < lo || sp >= hi {
                return Err(Unavailable); // on an alternate signal stack, or a user-made stack
            }
            let PerThread { caches, scratch, memos, next, walked, missed, .. } = &mut **t;
            'again: loop {
                frames.clear();
                let t = crate::selftime::mark();
                let want = Want {
                    addr: FrameAddress::InstructionPointer(pc),
                    sp,
                    bp,
                    snap: snap as *const Snapshot as usize,
                    with_stop: !stop.is_empty(),
                    max,
                };
                let pick = memos.pick(&want);
                crate::selftime::add(crate::selftime::Sub::Memo, t);
                let (slot, keep_in) = (pick.slot, pick.keep_in);
                if pick.whole {
                    let kept = memos.get(slot);
                    let key = kept.key;
                    if wanted(key) {
                        frames.clone_from(&kept.result);
                    }
                    memos.reused(slot);
                    flush_counts(walked, missed);
                    return Ok(key);
                }
                // The walk being made, set up only now: a walk taken whole (above) never touches
                // it, so its lines stay out of the common case.
                next.frames.clear();
                next.reads.clear();
                next.at_max = false;
                next.max = max;
                next.with_stop = want.with_stop;
                next.snap = want.snap;
                let memo = memos.get(slot);
                let mut memo_ok = memo.snap == next.snap && memo.with_stop == next.with_stop;
                let in_stack = |a: u64| a >= lo && a <= hi.saturating_sub(8);
                // The memo's words were read on this thread's stack, whose bounds never change:
                // they are still inside it.
                debug_assert!(memo.reads.iter().all(|&(a, _)| in_stack(a)));
                let mut regs = UnwindRegsX86_64::new(pc, sp, bp);
                let mut addr = FrameAddress::InstructionPointer(pc);
                let mut in_tracer = true;
                let mut same_as_memo = memo_ok;
                // Neighbouring frames are mostly in the same object: check its range first.
                let mut last = (0u64, 0u64);
                loop {
                    let k = next.frames.len();
                    // The rest of the walk may be the previous one's.
                    if memo_ok {
                        let t = crate::selftime::mark();
                        let found = memo.find(k, addr, regs.sp(), regs.bp());
                        let checked = found.map(|j| (j, memo.still_holds(memo.frames[j].reads as usize)));
                        crate::selftime::add(crate::selftime::Sub::Memo, t);
                        if let Some((j, valid)) = checked {
                            let from = memo.frames[j].reads as usize;
                            if valid && same_as_memo && j == k && (!memo.at_max || memo.max == max) {
                                // The whole walk is the previous one (ended where it ended, or
                                // cut at the same limit): keep it as the memo.
                                let key = memo.key;
                                if wanted(key) {
                                    frames.clone_from(&memo.result);
                                } else {
                                    frames.clear();
                                }
                                memos.reused(slot);
                                flush_counts(walked, missed);
                                return Ok(key);
                            }
                            if valid {
                                memo_ok = false; // one hit per walk: it covers the rest
                                let base = next.reads.len() as u32;
                                let first = next.frames.len();
                                let bp_here = regs.bp();
                                next.reads.extend_from_slice(&memo.reads[from..]);
                                let rebase = |r: u32| r - from as u32 + base;
                                for w in &memo.frames[j..] {
                                    let bp_use = match w.bp_use {
                                        BpUse::Restores(r) => BpUse::Restores(rebase(r)),
                                        u => u,
                                    };
                                    next.frames.push(Walked { reads: rebase(w.reads), bp_use, ..*w });
                                    let a = w.addr.address();
                                    if in_tracer && skip.iter().any(|&(s, e)| a >= s && a < e) {
                                        continue;
                                    }
                                    in_tracer = false;
                                    frames.push(a);
                                }
                                next.at_max = memo.at_max;
                                if frames.len() >= max {
                                    // Deeper than the previous walk: its end is not this one's.
                                    let excess = frames.len() - max;
                                    frames.truncate(max);
                                    next.frames.truncate(next.frames.len() - excess);
                                    let keep = next.frames.last().map_or(0, |w| w.reads as usize);
                                    next.reads.truncate(keep);
                                    if let Some(w) = next.frames.last_mut() {
                                        w.bp_use = BpUse::None;
                                    }
                                    next.at_max = true;
                                    // A later walk may go on from the last frame: its rbp must
                                    // be this stack's, not a free frame's older value.
                                    next.exact_bps(first, bp_here);
                                    break;
                                }
                                if !memo.at_max {
                                    break; // the previous walk reached the stack's end, unknown code or a stop frame here too
                                }
                                // The previous walk stopped at its limit: go on from its last frame.
                                let w = *next.frames.last().ok_or(Unavailable)?;
                                next.frames.pop();
                                frames.pop();
                                next.reads.truncate(w.reads as usize);
                                addr = w.addr;
                                regs = UnwindRegsX86_64::new(w.addr.address(), w.sp, w.bp);
                                // Fall through and walk on from that frame.
                            }
                        }
                    }
                    let a = addr.address();
                    let known = (a >= last.0 && a < last.1) || match snap.code_range(a) {
                        Some(r) => {
                            last = r;
                            true
                        }
                        None => false,
                    };
                    if !known && !nowhere(snap, a) {
                        if !rebuilt && loader_changed(snap) {
                            // A library loaded since the snapshot: re-read the objects, start over.
                            rebuilt = true;
                            snap = rebuild()?;
                            continue 'again;
                        }
                        remember_nowhere(snap, a);
                    }
                    // Unchanged so far only if this frame is the previous walk's at the same depth.
                    same_as_memo &= memo.frames.get(k).is_some_and(|w| w.addr == addr);
                    let r0 = next.reads.len();
                    next.frames.push(Walked { addr, sp: regs.sp(), bp: regs.bp(), reads: r0 as u32, bp_use: BpUse::None, free: false });
                    if !(in_tracer && skip.iter().any(|&(s, e)| a >= s && a < e)) {
                        in_tracer = false;
                        frames.push(a);
                    }
                    // libgcc too reports a frame without unwind info, then stops there.
                    if !known {
                        break;
                    }
                    if stop.iter().any(|&(s, e)| a >= s && a < e) {
                        break;
                    }
                    if frames.len() >= max {
                        next.at_max = true;
                        break;
                    }
                    let reads = &mut next.reads;
                    let mut read = |a: u64| -> Result<u64, ()> {
                        if !in_stack(a) {
                            return Err(());
                        }
                        // SAFETY: `a..a+8` lies within this thread's mapped stack.
                        let v = unsafe { (a as *const u64).read_unaligned() };
                        reads.push((a, v));
                        Ok(v)
                    };
                    let cache = caches.for_address(addr.address_for_lookup());
                    let hits = cache.stats().hit_count;
                    let before = regs;
                    let t = crate::selftime::mark();
                    let unwound = snap.unwinder.unwind_frame(addr, &mut regs, cache, &mut read);
                    let t = crate::selftime::add(crate::selftime::Sub::Rule, t);
                    *walked += 1;
                    let miss = cache.stats().hit_count == hits;
                    *missed += miss as u64;
                    // A rule that missed may be one framehop does not cache (ffi_call_unix64's
                    // CFA = rbp + 32, evaluated each time): unwound again with a poisoned rbp it
                    // fails, and framehop then caches its fallback rule (CFA = rbp + 16) for that
                    // address, which every later walk would use. Poison only a scratch cache.
                    let poison_cache = if miss { &mut **scratch } else { cache };
                    let bp_use = classify(&snap.unwinder, addr, before, &regs, &unwound, &next.reads[r0..], r0, poison_cache);
                    crate::selftime::add(crate::selftime::Sub::Classify, t);
                    if let Some(w) = next.frames.last_mut() {
                        w.bp_use = bp_use;
                    }
                    match unwound {
                        Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                            Some(f) => addr = f,
                            None => break,
                        },
                        Ok(None) | Err(_) => break,
                    }
                }
                next.result.clone_from(frames);
                next.key = crate::stackkey::hash(frames);
                next.seal();
                let key = next.key;
                memos.keep(keep_in, sp, next);
                flush_counts(walked, missed);
                return Ok(key);
            }
        })
        .map_err(|_| Unavailable)?
}

/// Adds a thread's counts to `WALKED` / `MISSED` now and then (a walk that ends in a full memo
/// hit may still have walked its innermost frames by rule).
fn flush_counts(walked: &mut u64, missed: &mut u64) {
    if *walked >= 256 {
        WALKED.fetch_add(std::mem::take(walked), Relaxed);
        MISSED.fetch_add(std::mem::take(missed), Relaxed);
    }
}


fn nowhere(snap: &Snapshot, addr: u64) -> bool {
    let id = snap as *const Snapshot as usize;
    NOWHERE_SEEN.try_with(|s| {
        let (set, of) = s.get();
        of == id && set[(addr % NOWHERE as u64) as usize] == addr
    })
    .unwrap_or(false)
}

fn remember_nowhere(snap: &Snapshot, addr: u64) {
    let id = snap as *const Snapshot as usize;
    let _ = NOWHERE_SEEN.try_with(|s| {
        let (mut set, of) = s.get();
        if of != id {
            set = [0; NOWHERE];
        }
        set[(addr % NOWHERE as u64) as usize] = addr;
        s.set((set, id));
    });
}

/// The instruction pointer, stack pointer and frame pointer at one point of `capture`.
#[inline(always)]
#[link_section = ".text.hot.gpumemtrace"]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory and leaves the stack as it is.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc, sp = out(reg) sp, bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (pc, sp, bp)
}

/// The calling thread's stack, [low, high).
#[cold]
fn stack_bounds() -> Option<(u64, u64)> {
    // SAFETY: pthread_getattr_np fills an attr we own and destroy; getstack reads it.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut c_void = null_mut();
        let mut size: usize = 0;
        let r = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 || addr.is_null() || size == 0 {
            return None;
        }
        Some((addr as u64, addr as u64 + size as u64))
    }
}

/// In a forked child the thread's stack is the same; nothing to reset. After `exec` all is new.
#[link_section = ".text.hot.gpumemtrace"]
fn snapshot() -> Result<&'static Snapshot, Unavailable> {
    let p = SNAPSHOT.load(Acquire);
    if p.is_null() || STALE.load(Acquire) {
        return rebuild();
    }
    // SAFETY: snapshots are leaked, never freed.
    Ok(unsafe { &*p })
}

/// Re-reads the loaded objects into a new snapshot (cold: a new library, or a dlclose).
fn rebuild() -> Result<&'static Snapshot, Unavailable> {
    // Never wait here: the thread holding the lock may wait on the loader lock, which a thread
    // inside dlopen (running a constructor that allocates) holds.
    let _held = BUILDING.try_lock().map_err(|_| Unavailable)?;
    if REBUILDS.fetch_add(1, SeqCst) >= MAX_REBUILDS {
        return Err(Unavailable);
    }
    STALE.store(false, SeqCst);
    let snap = Box::leak(Box::new(build()));
    SNAPSHOT.store(snap, Release);
    Ok(snap)
}

/// Whether objects were loaded or unloaded since `snap` (dl_iterate_phdr's counters).
fn loader_changed(snap: &Snapshot) -> bool {
    let (adds, subs) = crate::phdr::loader_counters();
    adds != snap.adds || subs != snap.subs
}

struct Found {
    name: String,
    bias: u64,
    loads: Vec<(u64, u64, bool)>,
    eh_frame_hdr: Option<(u64, u64)>,
}

fn build() -> Snapshot {
    let (mut objects, mut adds, mut subs) = (Vec::new(), 0, 0);
    crate::phdr::each_loaded(|o| {
        (adds, subs) = (o.adds, o.subs);
        let name = o.name.to_string_lossy().into_owned();
        objects.push(Found { name, bias: o.bias, loads: o.segments().collect(), eh_frame_hdr: o.header(libc::PT_GNU_EH_FRAME) });
        std::ops::ControlFlow::Continue(())
    });
    let mut unwinder = UnwinderX86_64::new();
    let mut code = Vec::new();
    for o in &objects {
        code.extend(o.loads.iter().filter(|l| l.2).map(|l| (l.0, l.1)));
        if let Some(m) = module(o) {
            unwinder.add_module(m);
        }
    }
    code.sort_unstable();
    Snapshot { unwinder, code, adds, subs }
}

/// The framehop module of one object: its .eh_frame_hdr (PT_GNU_EH_FRAME) and the .eh_frame it
/// points to, both read in place.
fn module(o: &Found) -> Option<Module<Mapped>> {
    let (hdr, hdr_len) = o.eh_frame_hdr?;
    let within = |a: u64| o.loads.iter().find(|l| a >= l.0 && a < l.1).copied();
    let hdr_seg = within(hdr)?;
    if hdr_len < 8 || hdr + hdr_len > hdr_seg.1 {
        return None;
    }
    // SAFETY: the header lies inside a mapped PT_LOAD segment (checked just above).
    let bytes = unsafe { std::slice::from_raw_parts(hdr as *const u8, hdr_len as usize) };
    if bytes[0] != 1 {
        return None;
    }
    let eh_frame = decode_pointer(bytes[1], &bytes[4..], hdr + 4, hdr)?;
    let eh_seg = within(eh_frame)?;
    let start = o.loads.iter().map(|l| l.0).min()?;
    let end = o.loads.iter().map(|l| l.1).max()?;
    let text = o.loads.iter().find(|l| l.2).map(|l| (l.0 - o.bias)..(l.1 - o.bias));
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text,
        eh_frame_svma: Some((eh_frame - o.bias)..(eh_seg.1 - o.bias)),
        eh_frame: Some(Mapped { ptr: eh_frame as *const u8, len: (eh_seg.1 - eh_frame) as usize }),
        eh_frame_hdr_svma: Some((hdr - o.bias)..(hdr + hdr_len - o.bias)),
        eh_frame_hdr: Some(Mapped { ptr: hdr as *const u8, len: hdr_len as usize }),
        ..Default::default()
    };
    Some(Module::new(o.name.clone(), start..end, o.bias, info))
}

/// A DW_EH_PE-encoded pointer (the encodings .eh_frame_hdr uses for `eh_frame_ptr`).
fn decode_pointer(enc: u8, b: &[u8], field: u64, datarel: u64) -> Option<u64> {
    let v: u64 = match enc & 0x0f {
        0x03 => u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as u64,
        0x0b => i32::from_le_bytes(b.get(..4)?.try_into().ok()?) as i64 as u64,
        0x00 | 0x04 | 0x0c => u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(v),
        0x10 => Some(field.wrapping_add(v)),
        0x30 => Some(datarel.wrapping_add(v)),
        _ => None,
    }
}

/// Our `dlclose`: marks the unwind snapshot stale (the object's unwind data may be unmapped
/// now), then calls glibc's.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
    static REAL: crate::lazy::LazyFn = crate::lazy::LazyFn::new();
    // SAFETY: the next definition of dlclose has dlclose's type.
    let Some(real) = (unsafe { REAL.typed::<DlcloseFn>(|| crate::resolve::dlsym_real(libc::RTLD_NEXT, c"dlclose")) }) else {
        return -1;
    };
    // SAFETY: forwarding the program's argument to the real dlclose.
    let r = unsafe { real(handle) };
    // Most calls only drop a reference (our own RTLD_NOLOAD lookups included): stale only when
    // the loader really unloaded something since the snapshot.
    let snap = SNAPSHOT.load(Acquire);
    // SAFETY: snapshots are leaked, never freed.
    if !snap.is_null() && unsafe { (*snap).subs } != crate::phdr::loader_counters().1 {
        STALE.store(true, SeqCst);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eh_frame_pointers_decode() {
        assert_eq!(decode_pointer(0x1b, &(-16i32).to_le_bytes(), 0x1004, 0x1000), Some(0xff4));
        assert_eq!(decode_pointer(0x03, &16u32.to_le_bytes(), 0x1004, 0x1000), Some(16));
        assert_eq!(decode_pointer(0x3b, &4i32.to_le_bytes(), 0x1004, 0x1000), Some(0x1004));
        assert_eq!(decode_pointer(0x1b, &[1, 2], 0, 0), None);
        assert_eq!(decode_pointer(0x50, &[0; 8], 0, 0), None);
    }

    #[inline(never)]
    fn fast() -> Vec<u64> {
        fast_until(&[])
    }

    #[inline(never)]
    fn fast_until(stop: &[(u64, u64)]) -> Vec<u64> {
        let mut v = Vec::new();
        // `Unavailable` while another test thread rebuilds the module snapshot: ask again.
        for _ in 0..1000 {
            if capture(&mut v, 64, &[], stop, |_| true).is_ok() {
                return v;
            }
            std::thread::yield_now();
        }
        panic!("the fast unwinder stayed unavailable")
    }

    #[test]
    fn a_stop_range_ends_the_stack_at_its_first_frame_whatever_the_memo_holds() {
        // Alternating walks with and without stop frames, all from one call site: each is
        // right, whichever came before it.
        let mut stop = Vec::new();
        let mut full = Vec::new();
        for (i, with_stop) in [false, true, true, false, true, false, false, true].into_iter().enumerate() {
            let range: &[(u64, u64)] = std::hint::black_box(if with_stop { &stop } else { &[] });
            let v = fast_until(range);
            if i == 0 {
                assert!(v.len() > 4, "{v:x?}");
                stop = vec![(v[3], v[3] + 1)];
                full = v;
            } else if with_stop {
                assert_eq!(v, full[..4], "walk {i}");
            } else {
                assert_eq!(v, full, "walk {i}");
            }
        }
    }

    #[inline(never)]
    fn slow() -> Vec<u64> {
        let mut v = Vec::new();
        // SAFETY: see unwind.rs.
        unsafe {
            backtrace::trace_unsynchronized(|f| {
                v.push(f.ip() as u64);
                v.len() < 64
            })
        };
        v
    }

    #[test]
    fn same_return_addresses_as_libgcc_above_the_capturing_function() {
        // The callers' part must match: the innermost frames differ (two capture functions,
        // two call sites), and libgcc ends a thread's stack with a 0 that carries nothing.
        let a = fast();
        let mut b = slow();
        while b.last() == Some(&0) {
            b.pop();
        }
        assert!(a.len() > 3, "{a:x?}");
        let n = a.len().min(b.len()) - 3;
        let outer = |v: &Vec<u64>| v.iter().rev().take(n).copied().collect::<Vec<_>>();
        assert_eq!(outer(&a), outer(&b), "fast {a:x?}\nlibgcc {b:x?}");
    }
}
