//! What was live, by stack, at moments known to matter only later: each group's peak, the last
//! out-of-memory failure, the end of the Python program. Taken in the one pass over the trace,
//! in O(1) per event and O(stacks) memory, so loading reads a trace once however long it is.
//!
//! The trick (memray's high-water mark aggregation works alike): a moment is a *mark*, a
//! counter bumped when it happens (a new peak replaces the last one). Each stack's tally
//! remembers, per kind of moment, which mark it last saw; the first change after a newer mark
//! first saves the tally as it was (its value at the mark). A tally not changed since the mark
//! is its value there.

use rustc_hash::FxHashMap;

use crate::read::live::{largest_first, GroupKey, StackUse};

/// The kinds of moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The peak of the tally's own group (each group has its own).
    Peak = 0,
    /// The last allocation that ran out of memory.
    Failure = 1,
    /// The Python program's end, before the interpreter's shutdown freed things.
    PythonExit = 2,
}
const MOMENTS: usize = 3;

#[derive(Clone, Copy, Default)]
struct Tally {
    bytes: u64,
    count: u64,
    /// Per moment: the mark this tally saw last, and its value then.
    seen: [u64; MOMENTS],
    at: [(u64, u64); MOMENTS],
}

impl Tally {
    fn change(&mut self, marks: [u64; MOMENTS], alloc: bool, bytes: u64) {
        for (m, &mark) in marks.iter().enumerate() {
            if self.seen[m] < mark {
                self.seen[m] = mark;
                self.at[m] = (self.bytes, self.count);
            }
        }
        if alloc {
            // Saturating: only a corrupt trace's sizes pass 2^64.
            self.bytes = self.bytes.saturating_add(bytes);
            self.count += 1;
        } else {
            self.bytes = self.bytes.saturating_sub(bytes);
            self.count = self.count.saturating_sub(1);
        }
    }

    fn at(&self, moment: Moment, mark: u64) -> (u64, u64) {
        if self.seen[moment as usize] == mark {
            self.at[moment as usize]
        } else {
            (self.bytes, self.count)
        }
    }
}

/// Tallies by (group, stack), with their values at the latest mark of each moment.
#[derive(Default)]
pub struct Snapshots {
    /// By (group index, stack): the replay's dense group index (`Step::group`), in `keys`.
    tallies: FxHashMap<(u32, u32), Tally>,
    /// Each group index's key.
    keys: Vec<Option<GroupKey>>,
    /// Device memory not in the allocator's pool (see `pool`), by (device, stack): what a
    /// direct driver allocation holds.
    direct: FxHashMap<(i32, u32), Tally>,
    /// By group index.
    peak_marks: Vec<u64>,
    failure_mark: u64,
    exit_mark: u64,
}

impl Snapshots {
    fn marks(&self, group: u32) -> [u64; MOMENTS] {
        [self.peak_marks.get(group as usize).copied().unwrap_or(0), self.failure_mark, self.exit_mark]
    }

    /// Group index `group` is `key`'s.
    fn know(&mut self, group: u32, key: GroupKey) {
        let i = group as usize;
        if self.keys.len() <= i {
            self.keys.resize(i + 1, None);
            self.peak_marks.resize(i + 1, 0);
        }
        self.keys[i] = Some(key);
    }

    /// `stack`'s live bytes in group `key` (index `group`) rose by one allocation of `bytes`
    /// (or fell by one).
    pub fn change(&mut self, group: u32, key: GroupKey, stack: u32, alloc: bool, bytes: u64) {
        if self.keys.get(group as usize).is_none_or(Option::is_none) {
            self.know(group, key);
        }
        let marks = self.marks(group);
        self.tallies.entry((group, stack)).or_default().change(marks, alloc, bytes);
    }

    /// Direct device memory of `stack` on `device` rose or fell by one range of `bytes`.
    pub fn direct_change(&mut self, device: i32, stack: u32, alloc: bool, bytes: u64) {
        let marks = [0, self.failure_mark, self.exit_mark];
        self.direct.entry((device, stack)).or_default().change(marks, alloc, bytes);
    }

    /// Now is the peak of group `key` (index `group`).
    pub fn peak(&mut self, group: u32, key: GroupKey) {
        self.know(group, key);
        self.peak_marks[group as usize] += 1;
    }

    /// Now is the last out-of-memory failure (so far).
    pub fn failure(&mut self) {
        self.failure_mark += 1;
    }

    /// Now is the Python program's end (the latest candidate).
    pub fn python_exit(&mut self) {
        self.exit_mark += 1;
    }

    /// What group `key` held by stack at the latest `moment` (largest first; empty if that
    /// moment never came).
    pub fn at(&self, moment: Moment, key: GroupKey) -> Vec<StackUse> {
        let Some(group) = self.keys.iter().position(|k| *k == Some(key)) else { return Vec::new() };
        let group = group as u32;
        let mark = self.marks(group)[moment as usize];
        if mark == 0 {
            return Vec::new();
        }
        let it = self.tallies.iter().filter(|((g, _), _)| *g == group).map(|(&(_, stack), t)| (stack, t.at(moment, mark)));
        sorted(it)
    }

    /// Direct device memory by device and stack at the latest Python exit.
    pub fn direct_at_python_exit(&self) -> std::collections::BTreeMap<i32, Vec<StackUse>> {
        let mut out: std::collections::BTreeMap<i32, Vec<(u32, (u64, u64))>> = Default::default();
        if self.exit_mark == 0 {
            return Default::default();
        }
        for (&(device, stack), t) in &self.direct {
            out.entry(device).or_default().push((stack, t.at(Moment::PythonExit, self.exit_mark)));
        }
        out.into_iter().map(|(d, v)| (d, sorted(v.into_iter()))).filter(|(_, v)| !v.is_empty()).collect()
    }
}

/// Non-empty tallies, largest first.
fn sorted(it: impl Iterator<Item = (u32, (u64, u64))>) -> Vec<StackUse> {
    let mut v: Vec<StackUse> =
        it.filter(|(_, (_, count))| *count > 0).map(|(stack, (bytes, count))| StackUse { stack, bytes, count }).collect();
    largest_first(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemtrace_format::MemKind;

    const A: GroupKey = GroupKey { device: 0, kind: MemKind::Device };
    const B: GroupKey = GroupKey { device: 1, kind: MemKind::Device };

    fn uses(v: &[StackUse]) -> Vec<(u32, u64, u64)> {
        v.iter().map(|u| (u.stack, u.bytes, u.count)).collect()
    }

    #[test]
    fn each_moment_keeps_the_tallies_of_its_latest_mark() {
        let mut s = Snapshots::default();
        s.change(0, A, 1, true, 100);
        s.change(0, A, 2, true, 50);
        s.peak(0, A); // 150
        s.change(0, A, 2, false, 50);
        s.change(0, A, 3, true, 70);
        assert_eq!(uses(&s.at(Moment::Peak, A)), [(1, 100, 1), (2, 50, 1)], "the peak, not now");
        s.change(0, A, 3, true, 90);
        s.peak(0, A); // 260: replaces the first
        s.python_exit();
        s.change(0, A, 1, false, 100);
        s.change(1, B, 9, true, 5); // another group: its own peak never came
        assert_eq!(uses(&s.at(Moment::Peak, A)), [(3, 160, 2), (1, 100, 1)]);
        assert_eq!(uses(&s.at(Moment::PythonExit, A)), [(3, 160, 2), (1, 100, 1)]);
        assert!(s.at(Moment::Peak, B).is_empty());
        assert!(s.at(Moment::Failure, A).is_empty(), "no failure happened");
        assert_eq!(uses(&s.at(Moment::PythonExit, B)), [], "B had nothing at the exit");
    }

    #[test]
    fn direct_memory_is_kept_at_the_python_exit() {
        let mut s = Snapshots::default();
        s.direct_change(0, 4, true, 1 << 20);
        s.python_exit();
        s.direct_change(0, 4, false, 1 << 20);
        s.direct_change(0, 5, true, 1 << 10);
        assert_eq!(s.direct_at_python_exit()[&0].iter().map(|u| (u.stack, u.bytes)).collect::<Vec<_>>(), [(4, 1 << 20)]);
    }
}
