//! The frame walk: the calling thread's frame chain read into (code, signature, instruction,
//! flags), compared with the thread's previous stack as it goes.
//!
//! Two walkers that give the same frames: one for any supported layout, and one for 3.12+
//! (frames with an owner, numbered code objects), the versions of today's training jobs, where
//! each frame's whole record comes from one pass without a branch on the layout per field.

use crate::pylayout::{plausible, read, Layout, FRAME_OWNED_BY_CSTACK};
use crate::record::{PyCapture, RawPyFrame};

use super::code::{code_info, numbered, signature, SigOffsets};
use super::{cache_has, Interp, ENTRY, MAX_PY_FRAMES};

/// The thread's innermost frame pointer (unchecked: the caller tests it with `plausible`).
///
/// # Safety
/// `tstate` must be the calling thread's live thread state of the detected interpreter.
#[link_section = ".text.hot.gpumemtrace"]
pub(super) unsafe fn current_frame(l: &Layout, tstate: u64) -> u64 {
    // SAFETY: fields of the thread state (and its `_PyCFrame`, 3.11/3.12) at this version's
    // offsets; the `_PyCFrame` pointer is checked before it is followed.
    let frame: u64 = unsafe { read(tstate + l.tstate_frame as u64) };
    match l.cframe_current {
        Some(off) if plausible(frame, 8) => unsafe { read(frame + off as u64) },
        Some(_) => 0,
        None => frame,
    }
}

/// Walks the frames into `out`. A frame equal to the one at the same depth of `prev` (this
/// thread's previous stack) needs no code-cache lookup: its code object was described then.
/// Answers whether the stack is `prev` again, frame for frame (then its key is `prev`'s), and how
/// many of its outermost frames are `prev`'s, frame for frame.
///
/// # Safety
/// `tstate` must be the calling thread's thread state of the detected interpreter.
#[link_section = ".text.hot.gpumemtrace"]
pub(super) unsafe fn walk(interp: &Interp, tstate: u64, out: &mut PyCapture, prev: &[RawPyFrame]) -> (bool, usize) {
    let l = &interp.layout;
    // SAFETY (both): the caller's promise.
    let numbered = l.minor >= 12
        && (l.frame_code, l.frame_previous, l.frame_instr, l.frame_owner, l.frame_is_entry, l.code_version)
            == (0, 8, 56, Some(70), None, Some(92));
    match (numbered, l.code_adaptive) {
        (true, 192) => unsafe { walk_numbered::<192, false>(interp, tstate, out, prev) },
        (true, 200) => unsafe { walk_numbered::<200, true>(interp, tstate, out, prev) },
        _ => unsafe { walk_any(interp, tstate, out, prev) },
    }
}

/// Where 3.12 and 3.13 keep what the walk reads: a frame's code object, previous frame,
/// instruction pointer and owner; a code object's number (its bytecode starts at 192 in 3.12, at
/// 200 in 3.13: `walk_numbered`'s parameter).
const FRAME_CODE: u64 = 0;
const FRAME_PREVIOUS: u64 = 8;
const FRAME_INSTR: u64 = 56;
const FRAME_OWNER: u64 = 70;
const CODE_VERSION: u64 = 92;

/// The walk for 3.12 and 3.13 at their usual offsets (constants here, so that the loop keeps
/// its values in registers): one pass reads each frame (previous, owner, code, instruction) and
/// its code object's number; the frames go into room reserved once per thread (the scratch
/// buffer keeps its capacity), without a capacity check a frame.
///
/// `CHECK_TYPE`: whether a frame's code object is checked to be one (its type, on the code
/// object's first line; the number lies on its second). 3.13's frames hold "a code object or
/// None"; 3.12's hold a code object, always (`PyCodeObject *f_code`, the entry shim's too), so
/// there the check is skipped: the first line of an outer frame's code object is one the
/// interpreter has not touched since that frame made its call, a cold line a frame on a busy
/// host.
///
/// # Safety
/// As [`walk`], with a layout at the offsets above and bytecode at `ADAPTIVE`; without
/// `CHECK_TYPE`, every frame's code pointer must be a code object (3.12).
#[link_section = ".text.hot.gpumemtrace"]
unsafe fn walk_numbered<const ADAPTIVE: u64, const CHECK_TYPE: bool>(
    interp: &Interp,
    tstate: u64,
    out: &mut PyCapture,
    prev: &[RawPyFrame],
) -> (bool, usize) {
    let l = &interp.layout;
    let code_type = interp.code_type;
    let frames = &mut out.frames;
    frames.clear();
    frames.reserve(MAX_PY_FRAMES);
    let room = frames.spare_capacity_mut();
    // Bounds checks on `room` go: `n` stays below MAX_PY_FRAMES <= room.len().
    assert!(room.len() >= MAX_PY_FRAMES);
    let room = &mut room[..MAX_PY_FRAMES];
    let mut n: usize = 0;
    // A code object whose number is 0 (the counter ran out): signed from its strings after.
    let mut unnumbered = false;
    // SAFETY (the loop): every address read is a field of an object reached from the thread
    // state through pointers checked by `plausible`, at offsets of this version's layout; a
    // code object's fields are read only once its type is `PyCode_Type`, or (3.12, no
    // `CHECK_TYPE`) where the interpreter holds nothing else there.
    let mut frame = unsafe { current_frame(l, tstate) };
    for _ in 0..4 * MAX_PY_FRAMES {
        if !plausible(frame, 8) {
            break;
        }
        let previous: u64 = unsafe { read(frame + FRAME_PREVIOUS) };
        if previous == frame {
            break;
        }
        if unsafe { read::<u8>(frame + FRAME_OWNER) } == FRAME_OWNED_BY_CSTACK {
            // The shim the interpreter pushes when it starts: the frame before it (inner side)
            // was the first one that invocation ran.
            if let Some(last) = n.checked_sub(1) {
                // SAFETY: slot n - 1 was written below.
                unsafe { room.get_unchecked_mut(last).assume_init_mut() }.flags |= ENTRY;
            }
            frame = previous;
            continue;
        }
        let code: u64 = unsafe { read(frame + FRAME_CODE) };
        if plausible(code, 8) && (!CHECK_TYPE || unsafe { read::<u64>(code + 8) } == code_type) {
            let instr = instr_offset(unsafe { read(frame + FRAME_INSTR) }, code + ADAPTIVE);
            let version: u32 = unsafe { read(code + CODE_VERSION) };
            unnumbered |= version == 0;
            // SAFETY: n < MAX_PY_FRAMES = room.len(): the loop ends when n reaches it.
            unsafe { room.get_unchecked_mut(n) }.write(RawPyFrame { code, sig: numbered(version), instr, flags: 0 });
            n += 1;
            if n == MAX_PY_FRAMES {
                break;
            }
        }
        frame = previous;
    }
    // SAFETY: the first `n` slots were written above.
    unsafe { frames.set_len(n) };
    if unnumbered {
        let at = SigOffsets::of(l);
        for f in frames.iter_mut() {
            // SAFETY: a code object of a frame of this thread, type-checked above (or a 3.12
            // frame's); the frame keeps it alive while the thread is in our hook.
            if unsafe { read::<u32>(f.code + CODE_VERSION) } == 0 {
                f.sig = unsafe { signature(&at, f.code) };
            }
        }
    }
    // SAFETY: as above.
    unsafe { compare(interp, &out.frames, prev, &mut out.new_codes) }
}

/// The walk for any supported layout, in two passes: the first follows the frame chain and
/// keeps (code, instruction, flags); the second reads each code object's signature. The
/// signature's reads (before 3.12, two `str` objects the interpreter does not touch while it
/// runs) then do not sit between one frame's loads and the next's; on this project's VM that
/// made no difference above the noise (docs/performance.md), the instruction count fell by 6 %.
/// The layout's offsets are copied into locals first.
///
/// # Safety
/// As [`walk`].
#[link_section = ".text.hot.gpumemtrace"]
unsafe fn walk_any(interp: &Interp, tstate: u64, out: &mut PyCapture, prev: &[RawPyFrame]) -> (bool, usize) {
    let l = &interp.layout;
    let (off_previous, off_code, off_instr, off_adaptive) =
        (l.frame_previous as u64, l.frame_code as u64, l.frame_instr as u64, l.code_adaptive as u64);
    let (owner_at, entry_at, lasti) = (l.frame_owner.map(|o| o as u64), l.frame_is_entry.map(|o| o as u64), l.minor == 10);
    let code_type = interp.code_type;
    let frames = &mut out.frames;
    frames.reserve(32);
    // SAFETY (whole loop): as in `walk_numbered`.
    let mut frame = unsafe { current_frame(l, tstate) };
    let mut steps = 0;
    while plausible(frame, 8) && frames.len() < MAX_PY_FRAMES && steps < 4 * MAX_PY_FRAMES {
        steps += 1;
        let previous: u64 = unsafe { read(frame + off_previous) };
        if previous == frame {
            break;
        }
        if let Some(off) = owner_at {
            let owner: u8 = unsafe { read(frame + off) };
            if owner == FRAME_OWNED_BY_CSTACK {
                if let Some(last) = frames.last_mut() {
                    last.flags |= ENTRY;
                }
                frame = previous;
                continue;
            }
        }
        let code: u64 = unsafe { read(frame + off_code) };
        if plausible(code, 8) && unsafe { read::<u64>(code + 8) } == code_type {
            let instr = if lasti {
                let lasti: i32 = unsafe { read(frame + off_instr) };
                (lasti.max(0) as u32).saturating_mul(2)
            } else {
                instr_offset(unsafe { read(frame + off_instr) }, code + off_adaptive)
            };
            // 3.10 runs each frame in its own interpreter-loop call.
            let mut flags = if lasti { ENTRY } else { 0 };
            if let Some(off) = entry_at {
                if unsafe { read::<u8>(frame + off) } != 0 {
                    flags |= ENTRY;
                }
            }
            frames.push(RawPyFrame { code, sig: 0, instr, flags });
        }
        frame = previous;
    }
    let at = SigOffsets::of(l);
    for f in frames.iter_mut() {
        // SAFETY: a code object of a frame of this thread, type-checked above; the frame keeps
        // it alive while the thread is in our hook.
        f.sig = unsafe { signature(&at, f.code) };
    }
    // SAFETY: as above.
    unsafe { compare(interp, &out.frames, prev, &mut out.new_codes) }
}

/// A frame's instruction pointer `p` as a byte offset into its bytecode starting at `start`; 0
/// when out of range (below the start the difference wraps around, so one comparison).
#[inline(always)]
fn instr_offset(p: u64, start: u64) -> u32 {
    let at = p.wrapping_sub(start);
    if at < 1 << 30 {
        at as u32
    } else {
        0
    }
}

/// Whether `frames` is `prev` again, frame for frame, and how many outermost frames they share
/// (see `same_as`); code objects neither in `prev` at the same depth nor in the cache of
/// described ones are described into `new_codes`.
///
/// # Safety
/// `frames` must be the calling thread's frames, just walked (their code objects alive).
#[inline(always)]
unsafe fn compare(interp: &Interp, frames: &[RawPyFrame], prev: &[RawPyFrame], new_codes: &mut Vec<crate::record::CodeInfo>) -> (bool, usize) {
    same_as(frames, prev, |f| {
        if !cache_has(f.code, f.sig) && !new_codes.iter().any(|c| c.code == f.code && c.sig == f.sig) {
            // SAFETY: the caller's promise.
            new_codes.push(unsafe { code_info(interp, f.code, f.sig) });
        }
    })
}

/// Whether `frames` is `prev` again, frame for frame, and how many of their outermost frames are
/// the same, frame for frame; `unseen` gets each frame whose code object `prev` does not hold at
/// the same depth counted from the outermost frame. Stacks are compared from the bottom:
/// consecutive allocations of a program share their outer frames and differ in depth (a layer's
/// forward, then its loss), so counted from the top nearly every frame of a stack one frame
/// deeper than the last was unseen, and looked up in the code cache (a cold line each on a busy
/// host).
#[inline(always)]
fn same_as(frames: &[RawPyFrame], prev: &[RawPyFrame], mut unseen: impl FnMut(&RawPyFrame)) -> (bool, usize) {
    let (n, m) = (frames.len(), prev.len());
    let common = n.min(m);
    // The innermost frames of the deeper stack have no counterpart.
    let (own, ours) = frames.split_at(n - common);
    let theirs = &prev[m - common..];
    own.iter().for_each(&mut unseen);
    // From the inside out: the outer frames in common start after the last that differs.
    let mut differs = 0;
    for (i, (f, p)) in ours.iter().zip(theirs).enumerate() {
        let seen = p.code == f.code && p.sig == f.sig;
        if !(seen & (p.instr == f.instr) & (p.flags == f.flags)) {
            differs = i + 1;
        }
        if !seen {
            unseen(f);
        }
    }
    let shared = common - differs;
    (n == m && shared == n, shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(code: u64, instr: u32) -> RawPyFrame {
        RawPyFrame { code, sig: code | 1, instr, flags: 0 }
    }

    fn unseen(frames: &[RawPyFrame], prev: &[RawPyFrame]) -> (bool, Vec<u64>) {
        let mut codes = Vec::new();
        let (same, _) = same_as(frames, prev, |f| codes.push(f.code));
        codes.sort_unstable_by(|a, b| b.cmp(a));
        (same, codes)
    }

    fn shared(frames: &[RawPyFrame], prev: &[RawPyFrame]) -> usize {
        same_as(frames, prev, |_| {}).1
    }

    #[test]
    fn a_stack_is_the_same_only_frame_for_frame() {
        let prev = [frame(0x30, 4), frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&prev, &prev), (true, vec![]));
        // Another instruction in the innermost frame: the same code objects, not the same stack.
        let moved = [frame(0x30, 6), frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&moved, &prev), (false, vec![]));
        let entry = [RawPyFrame { flags: crate::python::ENTRY, ..frame(0x30, 4) }, frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&entry, &prev), (false, vec![]));
        assert_eq!(unseen(&[], &[]), (true, vec![]));
    }

    /// A thread's frames laid out as 3.12 lays them out, in buffers of this test: the thread
    /// state, its `_PyCFrame`, and per frame a frame and a code object.
    struct Fake {
        tstate: Vec<u64>,
        cframe: Vec<u64>,
        frames: Vec<Vec<u64>>,
        codes: Vec<Vec<u64>>,
        code_type: Vec<u64>,
    }

    /// `spec`, innermost first: (version, instruction offset, owner) a frame; owner 3 is the
    /// interpreter's entry shim, version `None` a frame whose code object is not a code object.
    fn fake(spec: &[(Option<u32>, u64, u8)]) -> Fake {
        let l = Layout::for_minor(12).unwrap();
        let code_type = vec![0u64; 4];
        let mut f = Fake { tstate: vec![0; 16], cframe: vec![0; 4], frames: Vec::new(), codes: Vec::new(), code_type };
        for &(version, instr, owner) in spec {
            let mut code = vec![0u64; 64];
            code[1] = if version.is_some() { f.code_type.as_ptr() as u64 } else { 0x1234_5678 };
            // SAFETY (both writes): inside the buffers.
            unsafe { (code.as_mut_ptr().cast::<u8>().add(l.code_version.unwrap()) as *mut u32).write_unaligned(version.unwrap_or(0)) };
            let mut frame = vec![0u64; 10];
            frame[l.frame_code / 8] = code.as_ptr() as u64;
            frame[l.frame_instr / 8] = code.as_ptr() as u64 + l.code_adaptive as u64 + instr;
            unsafe { frame.as_mut_ptr().cast::<u8>().add(l.frame_owner.unwrap()).write(owner) };
            f.codes.push(code);
            f.frames.push(frame);
        }
        for i in 0..f.frames.len() {
            let outer = f.frames.get(i + 1).map_or(0, |o| o.as_ptr() as u64);
            f.frames[i][l.frame_previous / 8] = outer;
        }
        f.cframe[0] = f.frames.first().map_or(0, |o| o.as_ptr() as u64);
        f.tstate[l.tstate_frame / 8] = f.cframe.as_ptr() as u64;
        f
    }

    fn interp(f: &Fake) -> Interp {
        extern "C" fn none() -> *mut std::ffi::c_void {
            std::ptr::null_mut()
        }
        extern "C" fn yes() -> i32 {
            1
        }
        Interp {
            layout: Layout::for_minor(12).unwrap(),
            get_tstate: none,
            is_initialized: yes,
            initialized_flag: None,
            code_type: f.code_type.as_ptr() as u64,
            unicode_type: 0,
            bytes_type: 0,
        }
    }

    #[test]
    fn both_walkers_read_the_same_frames() {
        // Innermost first: a frame past its bytecode's range, an entry shim after the second
        // frame (so the second is its invocation's first), a frame that runs no code object, a
        // code object numbered 0 (told by its strings: here all null), and the outermost.
        let spec = [(Some(5), 1 << 31, 0), (Some(6), 40, 0), (None, 0, 3), (None, 8, 0), (Some(0), 12, 0), (Some(9), 2, 0)];
        let f = fake(&spec);
        let interp = interp(&f);
        let walk_with = |numbered: bool, prev: &[RawPyFrame]| {
            let mut out = PyCapture { frames: Vec::new(), new_codes: Vec::new() };
            let tstate = f.tstate.as_ptr() as u64;
            // SAFETY: the fake thread state leads to the fake frames, all alive.
            let same = unsafe {
                if numbered {
                    // Type-checked, as 3.13's (this stack has a frame without a code object).
                    walk_numbered::<192, true>(&interp, tstate, &mut out, prev)
                } else {
                    walk_any(&interp, tstate, &mut out, prev)
                }
            };
            (out, same)
        };
        let (any, _) = walk_with(false, &[]);
        let (numbered, same) = walk_with(true, &[]);
        assert_eq!(same, (false, 0));
        assert_eq!(numbered.frames, any.frames);
        let code = |i: usize| f.codes[i].as_ptr() as u64;
        let got: Vec<(u64, u32, u8)> = numbered.frames.iter().map(|p| (p.code, p.instr, p.flags)).collect();
        assert_eq!(got, [(code(0), 0, 0), (code(1), 40, ENTRY), (code(4), 12, 0), (code(5), 2, 0)]);
        let l = Layout::for_minor(12).unwrap();
        // SAFETY: a fake code object.
        assert_eq!(numbered.frames[2].sig, unsafe { signature(&SigOffsets::of(&l), code(4)) }, "number 0: signed by its strings");
        assert_eq!(numbered.frames[3].sig, super::numbered(9));
        // Walked again with the first walk as the previous stack: the same, frame for frame.
        assert_eq!(walk_with(true, &numbered.frames).1, (true, 4));
        assert_eq!(walk_with(false, &any.frames).1, (true, 4));
        // The code objects described are those the process had not seen.
        let described: Vec<u64> = numbered.new_codes.iter().map(|c| c.code).collect();
        assert_eq!(described, any.new_codes.iter().map(|c| c.code).collect::<Vec<_>>());
    }

    #[test]
    fn a_312_walk_reads_the_frames_a_checked_walk_reads() {
        // 3.12's frames always hold a code object, so its walk does not read their types: on
        // such frames (an entry shim among them, and a code object numbered 0) it gives what
        // the type-checked walk gives, and takes its own result as the same stack again.
        let spec = [(Some(5), 4, 0), (Some(6), 40, 0), (None, 0, 3), (Some(0), 12, 0), (Some(9), 2, 0)];
        let f = fake(&spec);
        let interp = interp(&f);
        let tstate = f.tstate.as_ptr() as u64;
        let mut checked = PyCapture { frames: Vec::new(), new_codes: Vec::new() };
        let mut trusted = PyCapture { frames: Vec::new(), new_codes: Vec::new() };
        // SAFETY (all three): the fake thread state leads to the fake frames, all alive.
        unsafe { walk_numbered::<192, true>(&interp, tstate, &mut checked, &[]) };
        assert_eq!(unsafe { walk_numbered::<192, false>(&interp, tstate, &mut trusted, &[]) }, (false, 0));
        assert_eq!(trusted.frames, checked.frames);
        assert_eq!(trusted.frames.len(), 4);
        assert_eq!(trusted.new_codes.len(), checked.new_codes.len());
        let prev = trusted.frames.clone();
        assert_eq!(unsafe { walk_numbered::<192, false>(&interp, tstate, &mut trusted, &prev) }, (true, 4));
    }

    #[test]
    fn stacks_of_other_depths_share_their_outer_frames() {
        // The outermost frame last: main (0x10) -> step (0x20) -> forward (0x30) [-> loss (0x40)].
        let prev = [frame(0x30, 4), frame(0x20, 8), frame(0x10, 2)];
        let deeper = [frame(0x40, 2), frame(0x30, 4), frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&deeper, &prev), (false, vec![0x40]));
        assert_eq!(shared(&deeper, &prev), 3);
        let shallower = [frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&shallower, &prev), (false, vec![]));
        assert_eq!(shared(&shallower, &prev), 2);
        // The outer frames in common end at the first that differs, whatever lies inside it.
        let returned = [frame(0x30, 4), frame(0x20, 10), frame(0x10, 2)];
        assert_eq!(shared(&returned, &prev), 1);
        assert_eq!(shared(&prev, &prev), 3);
        assert_eq!(shared(&[], &prev), 0);
        // A code object at the same address but of another signature is unseen.
        let recompiled = [RawPyFrame { sig: 0x99, ..frame(0x30, 4) }, frame(0x20, 8), frame(0x10, 2)];
        assert_eq!(unseen(&recompiled, &prev), (false, vec![0x30]));
        // Nothing before: every frame unseen.
        assert_eq!(unseen(&prev, &[]), (false, vec![0x30, 0x20, 0x10]));
    }
}
