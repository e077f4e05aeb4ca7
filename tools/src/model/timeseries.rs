//! Live bytes over time (bounded), bytes allocated by stack, and allocations by phase: an
//! observer of the replay, for the timeline, the phases report, diff and the exporters.
//!
//! Memory stays bounded whatever the trace length: a [`Series`] keeps at most [`MAX_BUCKETS`]
//! min/max buckets per group and coarsens them as time goes on.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::read::live::{GroupKey, StackUse};
use crate::read::replay::{Observer, Step, StepKind};

/// Buckets per series at most.
pub const MAX_BUCKETS: usize = 4096;
/// Width of a series bucket before any coarsening.
const FIRST_BUCKET_NS: u64 = 1_000;

/// Allocations per phase and group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseUse {
    pub allocations: u64,
    pub bytes: u64,
    pub failed: u64,
}

/// Live bytes over time, downsampled: bucket `i` covers `[i * bucket_ns, (i+1) * bucket_ns)`.
#[derive(Clone, Debug)]
pub struct Series {
    pub bucket_ns: u64,
    pub buckets: Vec<Option<Bucket>>,
    /// The last bucket added to and the times it covers: events come in time order, so most
    /// fall in it and need no division.
    last: (usize, u64, u64),
}

impl PartialEq for Series {
    fn eq(&self, other: &Series) -> bool {
        (self.bucket_ns, &self.buckets) == (other.bucket_ns, &other.buckets)
    }
}

impl Eq for Series {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Lowest and highest live bytes after an event in the bucket.
    pub min: u64,
    pub max: u64,
    /// Live bytes after the bucket's last event.
    pub last: u64,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            bucket_ns: FIRST_BUCKET_NS,
            buckets: Vec::new(),
            last: (0, 0, 0),
        }
    }
}

impl Series {
    pub fn add(&mut self, t: u64, v: u64) {
        let (last, from, to) = self.last;
        let i = if (from..to).contains(&t) {
            last
        } else {
            let mut i = (t / self.bucket_ns) as usize;
            while i >= MAX_BUCKETS {
                self.coarsen();
                i = (t / self.bucket_ns) as usize;
            }
            if self.buckets.len() <= i {
                self.buckets.resize(i + 1, None);
            }
            // Saturating: a corrupt trace may carry a time in the last bucket below u64::MAX.
            let from = i as u64 * self.bucket_ns;
            self.last = (i, from, from.saturating_add(self.bucket_ns));
            i
        };
        let b = self.buckets[i].get_or_insert(Bucket {
            min: v,
            max: v,
            last: v,
        });
        b.min = b.min.min(v);
        b.max = b.max.max(v);
        b.last = v;
    }

    fn coarsen(&mut self) {
        self.bucket_ns *= 2;
        self.last = (0, 0, 0);
        let old = std::mem::take(&mut self.buckets);
        self.buckets = old
            .chunks(2)
            .map(|pair| match (pair[0], pair.get(1).copied().flatten()) {
                (Some(a), Some(b)) => Some(Bucket {
                    min: a.min.min(b.min),
                    max: a.max.max(b.max),
                    last: b.last,
                }),
                (a, b) => a.or(b),
            })
            .collect();
    }

    /// `(bucket start ns, min, max, last)` for every bucket, empty ones carrying the last
    /// value forward (0 before the first event).
    pub fn points(&self) -> Vec<(u64, u64, u64, u64)> {
        let mut last = 0;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let t = i as u64 * self.bucket_ns;
                match b {
                    Some(b) => {
                        // The line enters the bucket at the previous value.
                        let p = (t, b.min.min(last), b.max.max(last), b.last);
                        last = b.last;
                        p
                    }
                    None => (t, last, last, last),
                }
            })
            .collect()
    }
}

/// The observer: series, allocations by stack and by phase as the replay goes.
#[derive(Default)]
pub struct TimeSeries {
    /// By the replay's dense group index (`Step::group`): a vector, not a map keyed by group,
    /// as every event looks its group up.
    groups: Vec<Option<PerGroup>>,
}

struct PerGroup {
    key: GroupKey,
    /// From the group's first allocation or free (a group that only failed has none).
    series: Option<Series>,
    allocated: FxHashMap<u32, (u64, u64)>,
    /// Allocations by phase while replaying, keyed by phase id (`u32::MAX`: none): no string
    /// per event. Named in `finish`.
    by_phase_id: FxHashMap<u32, PhaseUse>,
}

impl TimeSeries {
    fn group(&mut self, s: &Step) -> &mut PerGroup {
        let i = s.group as usize;
        if self.groups.len() <= i {
            self.groups.resize_with(i + 1, || None);
        }
        self.groups[i].get_or_insert_with(|| PerGroup {
            key: s.key,
            series: None,
            allocated: FxHashMap::default(),
            by_phase_id: FxHashMap::default(),
        })
    }
}

impl Observer for TimeSeries {
    fn step(&mut self, s: &Step) {
        let phase = s.phase_id.unwrap_or(u32::MAX);
        match s.kind {
            StepKind::Alloc => {
                let g = self.group(s);
                g.series.get_or_insert_with(Series::default).add(s.time_ns, s.group_live);
                let u = g.allocated.entry(s.alloc_stack).or_default();
                u.0 = u.0.saturating_add(s.size);
                u.1 += 1;
                let p = g.by_phase_id.entry(phase).or_default();
                p.allocations += 1;
                p.bytes = p.bytes.saturating_add(s.size);
            }
            StepKind::Free => self.group(s).series.get_or_insert_with(Series::default).add(s.time_ns, s.group_live),
            StepKind::FailedAlloc => self.group(s).by_phase_id.entry(phase).or_default().failed += 1,
            StepKind::BadFree | StepKind::Ignored => {}
        }
    }
}

/// What [`TimeSeries::finish`] hands over: series, bytes allocated by stack (largest first),
/// allocations by phase name (`""`: none).
pub type Finished = (
    BTreeMap<GroupKey, Series>,
    BTreeMap<GroupKey, Vec<StackUse>>,
    BTreeMap<(GroupKey, String), PhaseUse>,
);

impl TimeSeries {
    /// The results, phases named by `names` (by id).
    pub fn finish(self, names: &[String]) -> Finished {
        let (mut series, mut allocated, mut by_phase) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        for g in self.groups.into_iter().flatten() {
            for (id, u) in g.by_phase_id {
                let name = names.get(id as usize).cloned().unwrap_or_default();
                by_phase.insert((g.key, name), u);
            }
            if let Some(s) = g.series {
                series.insert(g.key, s);
            }
            if !g.allocated.is_empty() {
                let mut v: Vec<StackUse> =
                    g.allocated.into_iter().map(|(stack, (bytes, count))| StackUse { stack, bytes, count }).collect();
                v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.cmp(&b.stack)));
                allocated.insert(g.key, v);
            }
        }
        (series, allocated, by_phase)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{TraceBuilder, FREE, MALLOC};
    use crate::model::{Filter, StepKind, Trace};
    use gpumemtrace_format::{MemKind, Phase, PhaseOp, Record};

    fn phase(b: &mut TraceBuilder, t: u64, tid: u32, op: PhaseOp, name: &str) {
        b.rec(Record::Phase(Phase {
            time_ns: t,
            tid,
            op,
            name: name.into(),
        }));
    }

    #[test]
    fn series_coarsens_and_keeps_extremes() {
        let mut s = Series::default();
        s.add(0, 10);
        s.add(500, 30);
        s.add(999, 20);
        assert_eq!(s.buckets, [Some(Bucket { min: 10, max: 30, last: 20 })]);
        // Far beyond MAX_BUCKETS microseconds: the series coarsens, keeping min/max.
        s.add(10_000_000, 5);
        assert!(s.buckets.len() <= MAX_BUCKETS);
        assert_eq!(s.buckets[0], Some(Bucket { min: 10, max: 30, last: 20 }));
        let pts = s.points();
        assert_eq!(pts.last().unwrap().3, 5);
        assert_eq!(pts.iter().map(|p| p.2).max(), Some(30));
        // Empty buckets carry the last value forward.
        assert_eq!(pts[1], (s.bucket_ns, 20, 20, 20));
    }

    #[test]
    fn phases_filter_and_spans() {
        let mut b = TraceBuilder::new();
        phase(&mut b, 1, 1, PhaseOp::Mark, "epoch 1");
        b.ok(MALLOC, 2, 0x1000, 100, 1); // epoch 1
        phase(&mut b, 3, 1, PhaseOp::Push, "forward");
        b.ok(MALLOC, 4, 0x2000, 200, 2); // forward
        phase(&mut b, 5, 1, PhaseOp::Push, "attention");
        b.ok(MALLOC, 6, 0x3000, 300, 3); // attention inside forward
        phase(&mut b, 7, 1, PhaseOp::Pop, "");
        phase(&mut b, 8, 1, PhaseOp::Pop, "");
        b.ok(FREE, 9, 0x2000, 0, 0); // frees a forward allocation
        phase(&mut b, 10, 1, PhaseOp::Push, "backward");
        b.ok(MALLOC, 11, 0x4000, 400, 4);
        b.ok(FREE, 12, 0x1000, 0, 0);
        let all = b.load();
        let key = GroupKey { device: 0, kind: MemKind::Device };
        let by: Vec<_> = all
            .by_phase
            .iter()
            .map(|((k, n), u)| (*k, n.as_str(), u.bytes))
            .collect();
        assert_eq!(
            by,
            [(key, "attention", 300), (key, "backward", 400), (key, "epoch 1", 100), (key, "forward", 200)]
        );
        let spans: Vec<_> = all
            .spans
            .iter()
            .map(|s| (s.name.as_str(), s.depth, s.mark, s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            spans,
            [
                ("epoch 1", 0, true, 1, 12),
                ("forward", 0, false, 3, 8),
                ("attention", 1, false, 5, 7),
                ("backward", 0, false, 10, 12),
            ]
        );

        // --phase forward: the forward allocations (the nested one too); the free of one
        // counts, frees of others are not bad frees.
        let f = Filter { phase: Some("forward".into()), ..Filter::default() };
        let mut kinds = vec![];
        let t = Trace::load_with(|| Ok(&b.bytes[..]), &f, &mut |s: &Step| kinds.push((s.kind, s.phase.map(str::to_owned))))
            .unwrap();
        let g = &t.groups[&key];
        assert_eq!((g.allocations, g.allocated_bytes, g.frees, g.peak_bytes, g.live_bytes), (2, 500, 1, 500, 300));
        assert!(t.bad_frees.is_empty());
        assert_eq!(
            kinds,
            [
                (StepKind::Alloc, Some("forward".into())),
                (StepKind::Alloc, Some("attention".into())),
                (StepKind::Free, Some("epoch 1".into())),
            ]
        );
        assert_eq!(t.filtered_out, 2);
    }

    #[test]
    fn device_filter_and_allocated_by_stack() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .call(MALLOC, 2, 1, 0x2000, 300, 2, 0)
            .ok(FREE, 3, 0x1000, 0, 0)
            .ok(MALLOC, 4, 0x1000, 100, 1)
            .ok(FREE, 5, 0x2000, 0, 0); // frees device 1's allocation from device 0
        let t = Trace::load_with(|| Ok(&b.bytes[..]), &Filter { device: Some(0), ..Filter::default() }, &mut ())
            .unwrap();
        assert_eq!(t.groups.len(), 1);
        assert!(t.bad_frees.is_empty());
        let key = GroupKey { device: 0, kind: MemKind::Device };
        assert_eq!(t.allocated[&key], [StackUse { stack: 1, bytes: 200, count: 2 }]);
        let pts = t.series[&key].points();
        assert_eq!(pts, [(0, 0, 100, 100)]);
    }
}
