//! Growth: which stacks' live bytes keep rising over a run (the classic leak: one line gaining
//! the same bytes every step). Each group's events are cut into at most [`WINDOWS`] windows of
//! equal event counts (their size doubles as the run goes on, so memory stays O(stacks)); per
//! stack the minimum of its live bytes in each window is kept. Temporaries fall back to zero in
//! every window and weights stay flat; a leak's minimum climbs window after window.
//!
//! Windows count events, not time: a program that imports for seconds, pauses to compile or
//! waits on I/O between steps would otherwise put all its steps into one or two windows, and
//! the verdict would depend on the run's timing.

use rustc_hash::FxHashMap;

use crate::read::live::GroupKey;

/// Windows kept at most; when the events pass the last one, pairs are merged.
pub const WINDOWS: usize = 32;

/// One stack's windows. The window its last event fell in is kept inline (`w`, `cur_min`,
/// `cur_count`), the ones before it in vectors: most events touch only this struct, where
/// updating the vectors each time cost two more cache misses an event.
#[derive(Default)]
struct Trend {
    live: u64,
    live_count: u64,
    /// The window of the stack's last event, its minimum of live bytes, and the live
    /// allocations after that event.
    w: usize,
    cur_min: u64,
    cur_count: u64,
    /// Minimum of live bytes per window, from window 0, before window `w`.
    mins: Vec<u64>,
    /// Live allocations at the end of each window before window `w`.
    counts: Vec<u64>,
}

impl Trend {
    /// Every window up to `w`: the minimums and the counts.
    fn windows(mut self) -> (Vec<u64>, Vec<u64>, u64, u64) {
        self.mins.push(self.cur_min);
        self.counts.push(self.cur_count);
        (self.mins, self.counts, self.live, self.live_count)
    }

    fn from_windows(mut mins: Vec<u64>, mut counts: Vec<u64>, live: u64, live_count: u64) -> Trend {
        let w = mins.len() - 1;
        let cur_min = mins.pop().unwrap_or(0);
        let cur_count = counts.pop().unwrap_or(0);
        Trend { live, live_count, w, cur_min, cur_count, mins, counts }
    }
}

/// One group's windows (a group's own events: another device's do not move its windows).
struct GroupTrends {
    /// Events of the group so far, and per window (a power of two: it starts at 1 and doubles).
    events: u64,
    window_events: u64,
    /// Time of the last event of each window so far.
    ends: Vec<u64>,
    trends: FxHashMap<u32, Trend>,
}

#[derive(Default)]
pub struct Growth {
    /// By the replay's dense group index (`Step::group`), with the group's key.
    groups: Vec<Option<(GroupKey, GroupTrends)>>,
}

/// A stack whose live bytes rose: its minimum per window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackTrend {
    pub stack: u32,
    pub mins: Vec<u64>,
    /// Allocations of the stack live at the end of the last window counted.
    pub live_count: u64,
}

impl Growth {
    /// `stack`'s live bytes in group `key` (index `group`) rose (`alloc`) or fell by `bytes` at `t`.
    pub fn change(&mut self, group: u32, key: GroupKey, stack: u32, t: u64, alloc: bool, bytes: u64) {
        let i = group as usize;
        if self.groups.len() <= i {
            self.groups.resize_with(i + 1, || None);
        }
        let (_, g) = self.groups[i].get_or_insert_with(|| {
            (key, GroupTrends { events: 0, window_events: 1, ends: Vec::new(), trends: FxHashMap::default() })
        });
        // Windows hold a power of two of events: a shift, not a division (a division an event
        // was most of this observer's time).
        let mut w = (g.events >> g.window_events.trailing_zeros()) as usize;
        while w >= WINDOWS {
            g.merge();
            w = (g.events >> g.window_events.trailing_zeros()) as usize;
        }
        g.events += 1;
        if g.ends.len() <= w {
            g.ends.resize(w + 1, t);
        }
        g.ends[w] = t;
        let tr = g.trends.entry(stack).or_default();
        let (before, before_count) = (tr.live, tr.live_count);
        tr.live = if alloc { before.saturating_add(bytes) } else { before.saturating_sub(bytes) };
        tr.live_count = if alloc { before_count + 1 } else { before_count.saturating_sub(1) };
        if tr.w < w {
            // The stack's first event in window `w`: its last window is done, and the windows
            // since held what it held then.
            tr.mins.push(tr.cur_min);
            tr.counts.push(tr.cur_count);
            tr.mins.resize(w, before);
            tr.counts.resize(w, before_count);
            (tr.w, tr.cur_min) = (w, before);
        }
        tr.cur_min = tr.cur_min.min(tr.live);
        tr.cur_count = tr.live_count;
    }

    /// Stacks of each group whose minimum rose from the first window to the last one whose
    /// events all came before `end_ns` (a Python program's end, after which the interpreter's
    /// shutdown frees everything; or the end of the trace), with their per-window minimums
    /// over those windows.
    pub fn finish(self, end_ns: u64) -> FxHashMap<GroupKey, Vec<StackTrend>> {
        let mut out: FxHashMap<GroupKey, Vec<StackTrend>> = FxHashMap::default();
        for (key, g) in self.groups.into_iter().flatten() {
            // A window that reaches past `end_ns` includes the shutdown's frees: only windows
            // wholly before it count, unless that is none.
            let n = g.ends.iter().take_while(|&&e| e <= end_ns).count().max(1);
            let mut v = Vec::new();
            for (stack, tr) in g.trends {
                let (mut mins, mut counts, live, live_count) = tr.windows();
                if mins.len() < n {
                    mins.resize(n, live);
                    counts.resize(n, live_count);
                }
                mins.truncate(n);
                if mins.last() > mins.first() {
                    v.push(StackTrend { stack, mins, live_count: counts[n - 1] });
                }
            }
            if !v.is_empty() {
                v.sort_by_key(|s| s.stack);
                out.insert(key, v);
            }
        }
        out
    }
}

impl GroupTrends {
    fn merge(&mut self) {
        self.window_events *= 2;
        self.ends = self.ends.chunks(2).map(|c| c[c.len() - 1]).collect();
        for tr in self.trends.values_mut() {
            let (mins, counts, live, live_count) = std::mem::take(tr).windows();
            let mins = mins.chunks(2).map(|c| c.iter().copied().min().unwrap_or(0)).collect();
            let counts = counts.chunks(2).map(|c| c[c.len() - 1]).collect();
            *tr = Trend::from_windows(mins, counts, live, live_count);
        }
    }
}

/// How a series of per-window minimums grew: `Some((first, last, rises))` when it never fell
/// and rose in at least three windows; a one-time rise (weights loaded once) is not growth.
pub fn growing(mins: &[u64]) -> Option<(u64, u64, usize)> {
    let rises = mins.windows(2).filter(|w| w[1] > w[0]).count();
    let falls = mins.windows(2).filter(|w| w[1] < w[0]).count();
    let (first, last) = (*mins.first()?, *mins.last()?);
    (falls == 0 && rises >= 3 && last > first).then_some((first, last, rises))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use gpumemtrace_format::MemKind;

    const KEY: GroupKey = GroupKey { device: 0, kind: MemKind::Block };

    #[test]
    fn a_stack_gaining_bytes_every_step_grows_temporaries_and_weights_do_not() {
        let mut g = Growth::default();
        let step = 1_000_000; // 1 ms per step, 20 steps, after 5 s of start-up
        let t0 = 5_000_000_000;
        g.change(0, KEY, 1, t0, true, 100); // weights, once
        for s in 0..20u64 {
            let t = t0 + s * step + 10;
            g.change(0, KEY, 2, t, true, 50); // a temporary
            g.change(0, KEY, 3, t + 1, true, 8); // kept: the leak
            g.change(0, KEY, 2, t + 2, false, 50);
        }
        let out = g.finish(t0 + 20 * step);
        let trends = &out[&KEY];
        let stacks: Vec<u32> = trends.iter().map(|t| t.stack).collect();
        assert_eq!(stacks, [1, 3], "only stacks that ended above their start are candidates");
        assert_eq!(growing(&trends[0].mins), None, "weights rose once");
        let (first, last, rises) = growing(&trends[1].mins).unwrap();
        assert!(first <= 8 && last >= 8 * 18 && rises >= 10, "{:?}", trends[1].mins);
        assert!(trends[1].mins.len() <= WINDOWS);
    }

    /// The classic leak of issue 11: 12 steps, each keeping the graph (stack 3) among many
    /// temporaries. The verdict must not depend on when the steps ran: after a 6 s import, with
    /// a pause in the middle, or evenly spread.
    #[test]
    fn the_verdict_depends_on_the_order_of_events_not_on_their_timing() {
        let run = |time_of_step: &dyn Fn(u64) -> u64| {
            let mut g = Growth::default();
            g.change(0, KEY, 1, 0, true, 1000); // weights
            for s in 0..12u64 {
                let t = time_of_step(s);
                for k in 0..40 {
                    g.change(0, KEY, 2, t + 2 * k, true, 64); // temporaries
                    g.change(0, KEY, 2, t + 2 * k + 1, false, 64);
                }
                g.change(0, KEY, 3, t + 100, true, 512); // the graph kept
            }
            // Interpreter shutdown after the program's end frees everything.
            let end = time_of_step(12);
            g.change(0, KEY, 3, end + 1, false, 12 * 512);
            g.change(0, KEY, 1, end + 2, false, 1000);
            g.finish(end)
        };
        let even = run(&|s| 1_000_000 + s * 1_000_000);
        let late = run(&|s| 6_000_000_000 + s * 1_000 + if s >= 6 { 1_000_000_000 } else { 0 });
        assert_eq!(even, late);
        let leak = even[&KEY].iter().find(|t| t.stack == 3).expect("the leak is a candidate");
        let (first, last, rises) = growing(&leak.mins).expect("the leak grows");
        assert!(first <= 512 && last >= 10 * 512 && rises >= 5, "{:?}", leak.mins);
        // The window with the last step also holds the shutdown's frees, so it does not count.
        assert_eq!(leak.live_count * 512, *leak.mins.last().unwrap(), "one graph per step is live at the last window");
        assert!(even[&KEY].iter().all(|t| t.stack != 2), "temporaries are not growth");
    }

    #[test]
    fn falling_or_flat_series_are_not_growth() {
        assert_eq!(growing(&[0, 1, 2, 1, 3]), None);
        assert_eq!(growing(&[5, 5, 5, 5]), None);
        assert_eq!(growing(&[0, 1, 2, 3]), Some((0, 3, 3)));
    }

    /// Every window of every stack kept in vectors and updated at each event: what `Growth`
    /// computes, written the plain way.
    fn plain(events: &[(u32, u64, bool, u64)], end_ns: u64) -> Vec<StackTrend> {
        let (mut window_events, mut ends) = (1u64, Vec::<u64>::new());
        let mut trends: BTreeMap<u32, (u64, u64, Vec<u64>, Vec<u64>)> = BTreeMap::new();
        for (i, &(stack, t, alloc, bytes)) in events.iter().enumerate() {
            let mut w = (i as u64 / window_events) as usize;
            while w >= WINDOWS {
                window_events *= 2;
                ends = ends.chunks(2).map(|c| c[c.len() - 1]).collect();
                for tr in trends.values_mut() {
                    tr.2 = tr.2.chunks(2).map(|c| c.iter().copied().min().unwrap()).collect();
                    tr.3 = tr.3.chunks(2).map(|c| c[c.len() - 1]).collect();
                }
                w = (i as u64 / window_events) as usize;
            }
            if ends.len() <= w {
                ends.resize(w + 1, t);
            }
            ends[w] = t;
            let tr = trends.entry(stack).or_default();
            let (before, before_count) = (tr.0, tr.1);
            tr.0 = if alloc { before + bytes } else { before.saturating_sub(bytes) };
            tr.1 = if alloc { before_count + 1 } else { before_count.saturating_sub(1) };
            if tr.2.len() <= w {
                tr.2.resize(w + 1, before);
                tr.3.resize(w + 1, before_count);
            }
            tr.2[w] = tr.2[w].min(tr.0);
            tr.3[w] = tr.1;
        }
        let n = ends.iter().take_while(|&&e| e <= end_ns).count().max(1);
        let mut out = Vec::new();
        for (stack, (live, count, mut mins, mut counts)) in trends {
            if mins.len() < n {
                mins.resize(n, live);
                counts.resize(n, count);
            }
            mins.truncate(n);
            if mins.last() > mins.first() {
                out.push(StackTrend { stack, mins, live_count: counts[n - 1] });
            }
        }
        out
    }

    #[test]
    fn trends_are_those_of_every_window_kept_whole() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for events_n in [10usize, 100, 1000, 5000] {
            // A few stacks, some leaking (more allocations than frees), some idle for long stretches.
            let events: Vec<(u32, u64, bool, u64)> = (0..events_n)
                .map(|i| {
                    let stack = next(6) as u32 + if i % 500 < 50 { 10 } else { 0 };
                    (stack, i as u64 * 10, next(10) < 4 + stack as u64 % 3, 1 + next(64))
                })
                .collect();
            for end_ns in [events_n as u64 * 5, events_n as u64 * 10] {
                let mut g = Growth::default();
                for &(stack, t, alloc, bytes) in &events {
                    g.change(0, KEY, stack, t, alloc, bytes);
                }
                let got = g.finish(end_ns).remove(&KEY).unwrap_or_default();
                assert_eq!(got, plain(&events, end_ns), "{events_n} events, end {end_ns}");
            }
        }
    }
}
