//! Reserved bytes (the caching allocator's segments) over time, per device with blocks: an
//! observer of the model's replay feeding the model's own pool bookkeeping ([`Pools`], the
//! figures the summary prints) into the model's bounded [`Series`] (exact min/max per bucket).

use std::collections::BTreeMap;

use gpumemtrace_format::MemKind;

use crate::model::pool::Pools;
use crate::model::timeseries::Series;
use crate::model::{Observer, Step, StepKind};

#[derive(Default)]
pub struct Reserved {
    pools: Pools,
    /// Per device: reserved bytes after each change.
    pub series: BTreeMap<i32, Series>,
}

impl Observer for Reserved {
    fn step(&mut self, s: &Step) {
        if !matches!(s.kind, StepKind::Alloc | StepKind::Free)
            || !matches!(s.key.kind, MemKind::Block | MemKind::Device | MemKind::VmmMapped)
        {
            return;
        }
        let before = self.pools.by_device.get(&s.key.device).map(|p| p.reserved);
        self.pools.apply(s);
        let Some(p) = self.pools.by_device.get(&s.key.device) else { return };
        if before != Some(p.reserved) {
            self.series.entry(s.key.device).or_default().add(s.time_ns, p.reserved);
        }
    }
}
