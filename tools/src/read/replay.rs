//! The one replay of a trace's events: which counted (the filter), what each did to the live
//! set, and each group's and device's live bytes. Everything else that follows the events (the
//! model's statistics, the time series, the exporters' collectors, the merged ranks) is an
//! [`Observer`] shown each admitted event as a [`Step`], in trace order.

use std::collections::BTreeMap;

use gpumemtrace_format::{Api, Event, MemKind, Op, Phase, Record};

use super::filter::{Admission, Filter};
use super::live::{GroupKey, Live, LiveSet};
use super::phases::Phases;

/// What a replayed event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Alloc,
    Free,
    FailedAlloc,
    /// A free of a pointer that was not live, or a free that failed.
    BadFree,
    /// `cudaFree(NULL)` and the like.
    Ignored,
}

/// One admitted event, as observers see it.
#[derive(Clone, Debug)]
#[allow(dead_code)] // the fields exporters may use
pub struct Step<'a> {
    pub kind: StepKind,
    /// The event itself.
    pub event: &'a Event,
    pub time_ns: u64,
    /// The group of the memory: for a free, that of the allocation it frees.
    pub key: GroupKey,
    /// `key`'s index: dense from 0 in the order groups first came, the same for the whole
    /// replay (observers keep per-group books in vectors by it; [`Replay::group_key`]).
    pub group: u32,
    pub addr: u64,
    /// Bytes allocated, requested (failures) or released (frees).
    pub size: u64,
    /// The event's own stack.
    pub stack: u32,
    /// The stack that allocated the memory (frees: the allocation's).
    pub alloc_stack: u32,
    pub stream: u64,
    pub tid: u32,
    pub result: u32,
    pub api: &'a str,
    /// The event's phase (innermost open range of its thread, else the process mark), by id
    /// (see [`Phases::name`]), and by name.
    pub phase_id: Option<u32>,
    pub phase: Option<&'a str>,
    /// Live bytes of `key`'s group after the event.
    pub group_live: u64,
    /// GPU memory (kinds that occupy it) live on `key.device` after the event.
    pub device_live: u64,
    /// Which event it was (1-based, counting those the filter left out).
    pub ordinal: u64,
}

/// Follows a replay.
pub trait Observer {
    fn step(&mut self, s: &Step);
}

impl<F: FnMut(&Step)> Observer for F {
    fn step(&mut self, s: &Step) {
        self(s)
    }
}

/// No observer.
impl Observer for () {
    fn step(&mut self, _: &Step) {}
}

/// The replay state machine. Both passes of the model, and every merged trace, use it.
pub struct Replay {
    apis: super::byid::ById<Api>,
    books: Books,
    phases: Phases,
    admission: Admission,
    /// Events applied so far (admitted or not).
    ordinal: u64,
    /// Time of the last event applied.
    last_ns: u64,
    /// Time of the last event or phase record.
    end_ns: u64,
}

impl Replay {
    /// A replay counting the events `filter` admits; `keep_spans`: keep the phase spans.
    pub fn new(filter: &Filter, keep_spans: bool) -> Replay {
        Replay {
            apis: Default::default(),
            books: Books::default(),
            phases: Phases::new(keep_spans),
            admission: Admission::new(filter.clone()),
            ordinal: 0,
            last_ns: 0,
            end_ns: 0,
        }
    }

    /// Applies the records a replay needs (Api, Phase, Event); ignores the others. Returns
    /// false for an event of an API it has no record of (it cannot be replayed).
    pub fn feed(&mut self, rec: &Record, obs: &mut dyn Observer) -> bool {
        match rec {
            Record::Api(a) => self.api(a.clone()),
            Record::Phase(p) => self.phase(p),
            Record::Event(e) => return self.apply(e, obs),
            r => self.context(r),
        }
        true
    }

    /// Shows the filter a record it may need (`--module`: modules, stacks, Python code).
    pub fn context(&mut self, rec: &Record) {
        self.admission.context(rec);
    }

    /// Events will name the stack `native` (with a Python stack) by `key`.
    pub fn pair(&mut self, key: u32, native: u32) {
        self.admission.pair(key, native);
    }

    pub fn api(&mut self, a: Api) {
        self.apis.insert(a.id, a);
    }

    /// The API record of id `id`.
    pub fn api_of(&self, id: u32) -> Option<&Api> {
        self.apis.get(id)
    }

    pub fn phase(&mut self, p: &Phase) {
        self.end_ns = self.end_ns.max(p.time_ns);
        self.phases.apply(p);
    }

    /// Applies one event and shows its step to `obs` unless the filter left it out. Returns
    /// false when the event's API is unknown (nothing is applied then).
    pub fn apply(&mut self, e: &Event, obs: &mut dyn Observer) -> bool {
        let Some(api) = self.apis.get(e.api) else { return false };
        self.ordinal += 1;
        self.last_ns = self.last_ns.max(e.time_ns);
        self.end_ns = self.end_ns.max(e.time_ns);
        let ns = api.kind.namespace();
        if !self.admission.admit(api, e, ns, &self.phases) {
            return true;
        }
        let (kind, group, size, alloc_stack) = self.books.apply(api.op, api.kind, e, ns);
        let key = self.books.live.group_key(group);
        let phase_id = self.phases.current(e.tid);
        let step = Step {
            kind,
            event: e,
            time_ns: e.time_ns,
            key,
            group,
            addr: e.addr,
            size,
            stack: e.stack,
            alloc_stack,
            stream: e.stream,
            tid: e.tid,
            result: e.result,
            api: &api.name,
            phase_id,
            phase: phase_id.map(|i| self.phases.name(i)),
            group_live: self.books.groups.get(group as usize).copied().flatten().map_or(0, |g| g.0),
            device_live: self.books.device_live(key.device),
            ordinal: self.ordinal,
        };
        obs.step(&step);
        true
    }

    /// Events applied so far (admitted or not).
    pub fn ordinal(&self) -> u64 {
        self.ordinal
    }

    /// Time of the last event applied.
    pub fn last_ns(&self) -> u64 {
        self.last_ns
    }

    /// Time of the last event or phase record.
    pub fn end_ns(&self) -> u64 {
        self.end_ns
    }

    pub fn live(&self) -> &LiveSet {
        &self.books.live
    }

    /// The group of index `id` (a step's `group`).
    pub fn group_key(&self, id: u32) -> GroupKey {
        self.books.live.group_key(id)
    }

    /// Live bytes and count of every group seen (an allocation's or a failure's), in key order.
    pub fn groups(&self) -> BTreeMap<GroupKey, (u64, u64)> {
        let seen = self.books.groups.iter().enumerate();
        seen.filter_map(|(i, g)| g.map(|g| (self.group_key(i as u32), g))).collect()
    }

    /// Live GPU memory per device.
    pub fn devices(&self) -> BTreeMap<i32, u64> {
        self.books.devices.iter().copied().collect()
    }

    pub fn phases(&self) -> &Phases {
        &self.phases
    }

    pub fn phases_mut(&mut self) -> &mut Phases {
        &mut self.phases
    }

    /// The filter's own tallies: allocation calls it left out, devices of every allocation.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }
}

/// What the replay keeps of the memory: the live set, and live bytes per group and per device.
#[derive(Default)]
struct Books {
    live: LiveSet,
    /// Live bytes and count per group index (`None`: no allocation or failure of it yet).
    groups: Vec<Option<(u64, u64)>>,
    /// Live GPU memory per device that had an allocation of it, by device (a handful: searched
    /// in order).
    devices: Vec<(i32, u64)>,
}

impl Books {
    /// Applies an admitted event of an API of `op` and `kind`: what it did, the index of its
    /// group, its bytes and the stack that allocated them.
    fn apply(&mut self, op: Op, kind: MemKind, e: &Event, ns: u8) -> (StepKind, u32, u64, u32) {
        let fallback = GroupKey { device: e.device, kind };
        match (op, e.result == 0) {
            // `cudaMalloc(&p, 0)` succeeds and hands out NULL: nothing is allocated, and the
            // next one at NULL displaces nothing (PyTorch without its cache makes them for
            // empty tensors; counted as allocations at a live address they read as missed frees).
            (Op::Alloc, true) if e.addr == 0 => (StepKind::Ignored, self.live.group_id(fallback), 0, 0),
            (Op::Alloc, true) => {
                // A mapping belongs to the device of the physical memory it maps, whatever
                // device was current when cuMemMap was called.
                let device = match kind {
                    MemKind::VmmMapped => {
                        self.live.get(MemKind::VmmPhysical.namespace(), e.extra).map_or(e.device, |l| l.key.device)
                    }
                    _ => e.device,
                };
                let key = GroupKey { device, kind };
                let group = self.live.insert(ns, e.addr, Live { key, size: e.size, stack: e.stack, time_ns: e.time_ns });
                // Wrapping, as a release build does: live memory of a kind lies at distinct
                // addresses, so only a corrupt trace's sizes pass 2^64, and its free undoes
                // the add exactly.
                let g = self.group(group);
                g.0 = g.0.wrapping_add(e.size);
                g.1 += 1;
                if kind.occupies_gpu() {
                    let d = self.device(e.device);
                    *d = d.wrapping_add(e.size);
                }
                (StepKind::Alloc, group, e.size, e.stack)
            }
            (Op::Alloc, false) => {
                let group = self.live.group_id(fallback);
                self.group(group);
                (StepKind::FailedAlloc, group, e.size, e.stack)
            }
            // cudaFree(NULL) is a documented no-op, commonly used to create the context.
            (Op::Free, true) if e.addr == 0 => (StepKind::Ignored, self.live.group_id(fallback), 0, 0),
            (Op::Free, true) => match self.live.take_freed_in_group(ns, e) {
                // The freed entry says what was freed: cudaFree also frees managed memory.
                Some((old, group)) => {
                    let g = self.group(group);
                    g.0 = g.0.wrapping_sub(old.size);
                    g.1 -= 1;
                    if old.key.kind.occupies_gpu() {
                        if let Some(d) = self.devices.iter_mut().find(|d| d.0 == old.key.device) {
                            d.1 = d.1.wrapping_sub(old.size);
                        }
                    }
                    (StepKind::Free, group, old.size, old.stack)
                }
                None => (StepKind::BadFree, self.live.group_id(fallback), 0, 0),
            },
            (Op::Free, false) => (StepKind::BadFree, self.live.group_id(fallback), 0, 0),
        }
    }

    /// Group `id`'s live bytes and count, seen from now on.
    fn group(&mut self, id: u32) -> &mut (u64, u64) {
        let i = id as usize;
        if self.groups.len() <= i {
            self.groups.resize(i + 1, None);
        }
        self.groups[i].get_or_insert((0, 0))
    }

    fn device(&mut self, device: i32) -> &mut u64 {
        let i = match self.devices.iter().position(|d| d.0 == device) {
            Some(i) => i,
            None => {
                self.devices.push((device, 0));
                self.devices.sort_unstable_by_key(|d| d.0);
                self.devices.iter().position(|d| d.0 == device).expect("just added")
            }
        };
        &mut self.devices[i].1
    }

    fn device_live(&self, device: i32) -> u64 {
        self.devices.iter().find(|d| d.0 == device).map_or(0, |d| d.1)
    }
}
