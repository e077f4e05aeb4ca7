//! The memo of native walks (used by src/fastunwind.rs): what a thread's previous walks read,
//! so that a frame whose (address, sp, bp) and stack words are unchanged takes the rest of an
//! earlier walk instead of evaluating unwind rules again; and how a frame uses rbp (`classify`),
//! which decides which words a hit need not check.

use std::ops::Deref;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Unwinder};

/// What a thread's previous capture saw, to skip re-unwinding the part of the stack that has not
/// changed. Unwinding from a frame is a pure function of its (address, sp, bp), the unwind rules
/// (the snapshot) and the stack words the unwinder reads: so when a frame of the new walk has the
/// same (address, sp, bp) as a frame of the previous one, and every word read from there on
/// still holds the value read then, the rest of the walk is the previous one's, frame for frame.
/// Consecutive allocations from one place share almost their whole stack, so a warm capture
/// reads a few words per frame instead of evaluating its rule.
#[derive(Default)]
pub struct Memo {
    /// The snapshot the walk used (its rules and its judgement of known code).
    pub snap: usize,
    pub frames: Vec<Walked>,
    /// Stack words read, in order: frame `i` read `reads[frames[i].reads..frames[i + 1].reads]`.
    pub reads: Vec<(u64, u64)>,
    /// The walk stopped at the frame limit (and could go on from its last frame).
    pub at_max: bool,
    /// That limit.
    pub max: usize,
    /// The frames the walk returned.
    pub result: Vec<u64>,
    /// Their key (`stackkey::hash`), made when the walk is kept: a walk taken whole from
    /// memory is not hashed again.
    pub key: u64,
    /// The walk had stop frames: a memo is only used by walks of the same kind, whose ends
    /// (a stop frame, the stack's end, unknown code) are then the same.
    pub with_stop: bool,
    /// Indices in `reads` of saved-rbp slots whose value the rest of the walk never uses (see
    /// `Walked::free`), ascending: not checked, so a caller's changing rbp does not end the hit.
    pub dead: Vec<u32>,
    /// The words a walk taken whole checks: `reads` without the `dead` ones, made by `seal`
    /// (a kept walk's reads do not change after it), so the check is one tight loop.
    pub live: Vec<(u64, u64)>,
}

#[derive(Clone, Copy)]
pub struct Walked {
    pub addr: FrameAddress,
    pub sp: u64,
    /// Exact unless `free` (then it may be an older walk's: no outcome depends on it).
    pub bp: u64,
    /// Start of the words read to unwind this frame.
    pub reads: u32,
    /// What unwinding this frame did with rbp.
    pub bp_use: BpUse,
    /// No outcome of the walk from this frame depends on its rbp: rbp is carried through frames
    /// whose rules ignore it, up to a frame that restores it from the stack, or to a walk's end
    /// reached without unwinding. Such a frame matches whatever its rbp.
    pub free: bool,
}

/// How a frame's unwinding depends on rbp, found by unwinding it a second time with rbp (and the
/// candidate saved-rbp word) poisoned: framehop does not show its rules.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BpUse {
    /// Not unwound (the walk's last frame).
    None,
    /// The caller's rbp is this frame's; nothing else depends on it.
    Carries,
    /// The caller's rbp is the word `reads[i]` (absolute index), used for nothing else; nothing
    /// depends on this frame's rbp.
    Restores(u32),
    /// Anything else: the frame's outcome depends on its rbp.
    Uses,
}

/// How unwinding the frame at `addr` from `before` (giving `after` and `out`, reading `rec`,
/// the words from index `r0` on) depends on rbp: the frame is unwound again with rbp poisoned
/// and, where one word read holds the new rbp, that word poisoned differently. A frame whose
/// outcome, other than rbp, and whose reads stay the same ignores rbp; its new rbp is then
/// either the poisoned rbp (carried) or the poisoned word (restored).
#[allow(clippy::too_many_arguments)]
pub fn classify<D: Deref<Target = [u8]>>(
    unwinder: &UnwinderX86_64<D>,
    addr: FrameAddress,
    before: UnwindRegsX86_64,
    after: &UnwindRegsX86_64,
    out: &Result<Option<u64>, framehop::Error>,
    rec: &[(u64, u64)],
    r0: usize,
    cache: &mut CacheX86_64,
) -> BpUse {
    const P: u64 = 0x5a5a_5a5a_5a5a_5a50;
    const Q: u64 = 0x3c3c_3c3c_3c3c_3c30;
    let bp_out = after.bp();
    let mut holding = rec.iter().enumerate().filter(|(_, r)| r.1 == bp_out).map(|(i, _)| i);
    let cand = match (holding.next(), holding.next()) {
        (Some(i), None) if matches!(out, Ok(Some(_))) => Some(i),
        _ => None,
    };
    let mut regs = UnwindRegsX86_64::new(before.ip(), before.sp(), before.bp() ^ P);
    let (mut n, mut same) = (0, true);
    let mut read = |a: u64| -> Result<u64, ()> {
        match rec.get(n) {
            Some(&(at, v)) if at == a => {
                n += 1;
                Ok(if cand == Some(n - 1) { v ^ Q } else { v })
            }
            _ => {
                same = false;
                Err(())
            }
        }
    };
    let poisoned = unwinder.unwind_frame(addr, &mut regs, cache, &mut read);
    if !same || n != rec.len() {
        return BpUse::Uses;
    }
    match (out, &poisoned) {
        (Ok(Some(a)), Ok(Some(b))) if a == b && regs.sp() == after.sp() => {
            if bp_out == before.bp() && regs.bp() == before.bp() ^ P {
                BpUse::Carries
            } else if cand.is_some() && regs.bp() == bp_out ^ Q {
                BpUse::Restores((r0 + cand.unwrap_or(0)) as u32)
            } else {
                BpUse::Uses
            }
        }
        // The walk ends here whatever rbp.
        (Ok(None), Ok(None)) | (Err(_), Err(_)) => BpUse::Carries,
        _ => BpUse::Uses,
    }
}

impl Memo {
    /// Whether every word read from `reads[from]` on still holds its value (the dead ones aside).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn still_holds(&self, from: usize) -> bool {
        let mut d = self.dead.partition_point(|&i| (i as usize) < from);
        for (i, &(a, v)) in self.reads.iter().enumerate().skip(from) {
            // SAFETY: `a..a+8` lies within this thread's mapped stack (`capture` read it there).
            let now = unsafe { (a as *const u64).read_unaligned() };
            if now != v {
                while self.dead.get(d).is_some_and(|&x| (x as usize) < i) {
                    d += 1;
                }
                if self.dead.get(d) != Some(&(i as u32)) {
                    return false;
                }
            }
        }
        true
    }

    /// Marks which frames are `free` and which saved-rbp words are `dead`, from the outermost
    /// frame in: nothing past the walk's end depends on anything, but a frame a later walk may
    /// go on from (the last one of a walk cut at its limit) uses its rbp.
    pub fn seal(&mut self) {
        self.dead.clear();
        let n = self.frames.len();
        let mut outer_free = true;
        for i in (0..n).rev() {
            let w = &mut self.frames[i];
            w.free = match w.bp_use {
                BpUse::None => !(self.at_max && i + 1 == n),
                BpUse::Carries => outer_free,
                BpUse::Restores(r) => {
                    if outer_free {
                        self.dead.push(r);
                    }
                    true
                }
                BpUse::Uses => false,
            };
            outer_free = w.free;
        }
        self.dead.reverse();
        self.live.clear();
        let mut dead = self.dead.iter().peekable();
        for (i, &r) in self.reads.iter().enumerate() {
            if dead.next_if(|&&d| d as usize == i).is_none() {
                self.live.push(r);
            }
        }
    }

    /// Whether every word a walk taken whole depends on still holds its value (see `seal`).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn all_live_hold(&self) -> bool {
        // Without an early exit: a hit (the common case) reads every word anyway, and a loop
        // with no branch a word runs in about half the instructions.
        // SAFETY: each address lies within this thread's mapped stack (`capture` read it there).
        let diff = self.live.iter().fold(0, |acc, &(a, v)| acc | (unsafe { (a as *const u64).read_unaligned() } ^ v));
        diff == 0
    }

    /// Sets the rbp of `frames[from..]` to this stack's, `bp` being that of `frames[from]`
    /// (copied from a memo whose free frames may hold an older walk's), and the saved-rbp words
    /// on the way to what they hold now.
    pub fn exact_bps(&mut self, from: usize, mut bp: u64) {
        for i in from..self.frames.len() {
            self.frames[i].bp = bp;
            bp = match self.frames[i].bp_use {
                BpUse::Carries => bp,
                BpUse::Restores(r) => {
                    let (a, _) = self.reads[r as usize];
                    // SAFETY: `a..a+8` lies within this thread's mapped stack (it was read there).
                    let v = unsafe { (a as *const u64).read_unaligned() };
                    self.reads[r as usize].1 = v;
                    v
                }
                BpUse::Uses | BpUse::None => match self.frames.get(i + 1) {
                    Some(w) => w.bp,
                    None => break,
                },
            };
        }
    }

    /// The frame of this walk at the same (address, sp, bp), if any: sps grow outwards. Most
    /// often the one at the same depth `k`.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn find(&self, k: usize, addr: FrameAddress, sp: u64, bp: u64) -> Option<usize> {
        if self.frames.get(k).is_some_and(|w| w.addr == addr && w.sp == sp && (w.bp == bp || w.free)) {
            return Some(k);
        }
        let mut i = self.frames.partition_point(|w| w.sp < sp);
        while let Some(w) = self.frames.get(i).filter(|w| w.sp == sp) {
            if w.addr == addr && (w.bp == bp || w.free) {
                return Some(i);
            }
            i += 1;
        }
        None
    }
}

/// Recent walks of one thread. A training step allocates from tens of places in turn, each with
/// its own native stack (every op has its dispatcher chain), so the previous walk alone rarely
/// is the same place: most frames were walked by rule again (13-20 an event on the H200, at
/// 80-150 ns each with the host's caches cold). A walk is taken whole from the kept one whose
/// every word read still holds: first the one that followed the previous walk last time (a loop
/// visits its places in the same order), else any kept walk that began at the same stack pointer.
pub struct Memos {
    walks: Vec<Memo>,
    /// Each slot's first stack pointer (0: empty), contiguous: scanned without touching walks.
    first_sp: Vec<u64>,
    /// When each slot was last used (a counter), to replace the least recently used.
    used: Vec<u64>,
    /// The slot used after each slot, last time.
    follows: Vec<u16>,
    now: u64,
    /// The slot of this thread's previous walk.
    last: usize,
}

const WALKS: usize = 64;

/// What a new walk needs of a kept one to take it whole.
pub struct Want {
    pub addr: FrameAddress,
    pub sp: u64,
    pub bp: u64,
    pub snap: usize,
    pub with_stop: bool,
    pub max: usize,
}

/// `Memos::pick`'s answer.
pub struct Pick {
    /// The kept walk to walk against (and take whole if `whole`).
    pub slot: usize,
    /// Every word it read still holds: it is this walk.
    pub whole: bool,
    /// The slot the new walk replaces (when not `whole`).
    pub keep_in: usize,
}

impl Memos {
    pub fn new() -> Memos {
        Memos {
            walks: (0..WALKS).map(|_| Memo::default()).collect(),
            first_sp: vec![0; WALKS],
            used: vec![0; WALKS],
            follows: vec![0; WALKS],
            now: 0,
            last: 0,
        }
    }

    #[inline(never)] // out of `pick`'s closure, which would land outside the hot section
    #[link_section = ".text.hot.gpumemtrace"]
    fn takes_whole(&self, i: usize, w: &Want) -> bool {
        let m = &self.walks[i];
        self.first_sp[i] == w.sp
            && m.snap == w.snap
            && m.with_stop == w.with_stop
            && (!m.at_max || m.max == w.max)
            && m.find(0, w.addr, w.sp, w.bp) == Some(0)
            && m.all_live_hold()
    }

    #[link_section = ".text.hot.gpumemtrace"]
    pub fn pick(&self, w: &Want) -> Pick {
        let predicted = self.follows[self.last] as usize;
        let whole = [predicted, self.last]
            .into_iter()
            .chain((0..WALKS).filter(|&i| i != predicted && i != self.last && self.first_sp[i] == w.sp))
            .find(|&i| self.takes_whole(i, w));
        match whole {
            Some(slot) => Pick { slot, whole: true, keep_in: slot },
            None => {
                let lru = (0..WALKS).min_by_key(|&i| self.used[i]).unwrap_or(0);
                Pick { slot: self.last, whole: false, keep_in: lru }
            }
        }
    }

    pub fn get(&self, slot: usize) -> &Memo {
        &self.walks[slot]
    }

    /// The walk in `slot` was taken whole.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn reused(&mut self, slot: usize) {
        self.touch(slot);
    }

    /// Keeps the walk just made (`next`), which began at stack pointer `sp`, in `slot`; `next`
    /// gets the walk it replaces (its buffers are reused).
    pub fn keep(&mut self, slot: usize, sp: u64, next: &mut Memo) {
        std::mem::swap(&mut self.walks[slot], next);
        self.first_sp[slot] = sp;
        self.touch(slot);
    }

    #[link_section = ".text.hot.gpumemtrace"]
    fn touch(&mut self, slot: usize) {
        self.now += 1;
        self.used[slot] = self.now;
        self.follows[self.last] = slot as u16;
        self.last = slot;
    }
}
