//! The model's statistics per device and memory kind, as an observer of the replay: how much was
//! allocated and freed, peaks (and what was live then, see `snapshots`),
//! failures with what was live when they failed, bad frees. It keeps the caching allocator's
//! pools (see `pool`) and the growth of stacks (see `growth`) with them, as a failure records
//! the pool of its device.

use std::collections::BTreeMap;

use super::growth::Growth;
use super::pool::Pools;
use super::snapshots::Snapshots;
use super::trace::{BadFree, DeviceTotal, Failure, Group};
use crate::read::live::GroupKey;
use crate::read::replay::{Observer, Step, StepKind};

/// More bad frees than this are only counted: a trace that starts late in a process can
/// have one per event, and memory must not grow with the event count.
pub const MAX_BAD_FREES: usize = 100_000;

pub struct Groups {
    /// By key, once [`Groups::settle`] ran (after the replay).
    pub groups: BTreeMap<GroupKey, Group>,
    /// During the replay: by the replay's dense group index (`Step::group`), no map lookup an event.
    by_index: Vec<Option<(GroupKey, Group)>>,
    pub devices: BTreeMap<i32, DeviceTotal>,
    pub failures: Vec<Failure>,
    pub bad_frees: Vec<BadFree>,
    pub bad_frees_omitted: u64,
    /// Segments and blocks (see `pool`).
    pub pools: Pools,
    /// Live bytes per stack over time.
    pub growth: Growth,
    /// What was live by stack at each group's peak, the last failure, the Python exit.
    pub snapshots: Snapshots,
}

impl Default for Groups {
    fn default() -> Groups {
        Groups {
            groups: BTreeMap::new(),
            by_index: Vec::new(),
            devices: BTreeMap::new(),
            failures: Vec::new(),
            bad_frees: Vec::new(),
            bad_frees_omitted: 0,
            pools: Pools::lazy().tracking_direct_memory(),
            growth: Growth::default(),
            snapshots: Snapshots::default(),
        }
    }
}

impl Groups {
    pub fn group(&mut self, key: GroupKey) -> &mut Group {
        self.groups.entry(key).or_default()
    }

    /// The statistics of the step's group, during the replay.
    fn slot(&mut self, s: &Step) -> &mut Group {
        let i = s.group as usize;
        if self.by_index.len() <= i {
            self.by_index.resize_with(i + 1, || None);
        }
        &mut self.by_index[i].get_or_insert_with(|| (s.key, Group::default())).1
    }

    /// The replay is done: the statistics by key.
    pub fn settle(&mut self) {
        for (key, g) in std::mem::take(&mut self.by_index).into_iter().flatten() {
            self.groups.insert(key, g);
        }
    }

    fn bad_free(&mut self, s: &Step) {
        if self.bad_frees.len() >= MAX_BAD_FREES {
            self.bad_frees_omitted += 1;
            return;
        }
        let e = s.event;
        self.bad_frees.push(BadFree {
            api: s.api.to_owned(),
            device: e.device,
            addr: e.addr,
            result: e.result,
            time_ns: e.time_ns,
            stack: e.stack,
        });
    }
}

impl Observer for Groups {
    fn step(&mut self, s: &Step) {
        self.pools.apply(s);
        for (device, stack, rose, bytes) in self.pools.take_direct_changes() {
            self.snapshots.direct_change(device, stack, rose, bytes);
        }
        let key = s.key;
        match s.kind {
            StepKind::Alloc => {
                self.snapshots.change(s.group, key, s.alloc_stack, true, s.size);
                let g = self.slot(s);
                g.allocations += 1;
                g.allocated_bytes = g.allocated_bytes.saturating_add(s.size);
                if s.group_live > g.peak_bytes {
                    g.peak_bytes = s.group_live;
                    g.peak_time_ns = s.time_ns;
                    g.peak_event = Some(s.ordinal);
                    self.snapshots.peak(s.group, key);
                }
                if key.kind.occupies_gpu() {
                    let d = self.devices.entry(key.device).or_default();
                    if s.device_live > d.peak_bytes {
                        d.peak_bytes = s.device_live;
                        d.peak_time_ns = s.time_ns;
                    }
                }
                self.growth.change(s.group, key, s.alloc_stack, s.time_ns, true, s.size);
            }
            StepKind::FailedAlloc => {
                self.slot(s).failed += 1;
                let e = s.event;
                let pool = self.pools.by_device.get(&e.device).cloned();
                self.failures.push(Failure {
                    pool,
                    ordinal: s.ordinal,
                    api: s.api.to_owned(),
                    device: e.device,
                    kind: key.kind,
                    size: e.size,
                    result: e.result,
                    time_ns: e.time_ns,
                    stack: e.stack,
                    live_bytes_on_device: s.device_live,
                });
                if self.failures.last().is_some_and(|f| f.class() == crate::units::Failed::OutOfMemory) {
                    self.snapshots.failure();
                }
            }
            StepKind::Free => {
                self.slot(s).frees += 1;
                self.snapshots.change(s.group, key, s.alloc_stack, false, s.size);
                self.growth.change(s.group, key, s.alloc_stack, s.time_ns, false, s.size);
            }
            StepKind::BadFree => self.bad_free(s),
            StepKind::Ignored => {}
        }
    }
}
