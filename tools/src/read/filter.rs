//! Which events a report counts (`--device`, `--phase`). Frees count when the allocation they
//! free counted.

use gpumemtrace_format::{Api, Event, Op};
use rustc_hash::FxHashSet;

use super::phases::Phases;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only allocations made on this device (-1: host memory).
    pub device: Option<i32>,
    /// Only allocations made while this phase was open on the calling thread (innermost or
    /// enclosing range), or, on a thread with no open range, while it was the process mark.
    pub phase: Option<String>,
}

/// A filter as the replay applies it.
#[derive(Default)]
pub struct Admission {
    filter: Filter,
    /// Live allocations the filter left out, so that their frees are left out too.
    ignored: FxHashSet<(u8, u64)>,
    /// Allocation calls the filter left out.
    pub filtered_out: u64,
    /// Devices of every allocation call, whatever the filter, and the last one seen (most
    /// calls repeat it).
    devices: FxHashSet<i32>,
    last_device: Option<i32>,
}

impl Admission {
    pub fn new(filter: Filter) -> Admission {
        Admission { filter, ..Admission::default() }
    }

    /// Whether the filter admits the event (`ns`: its pointer namespace).
    pub fn admit(&mut self, api: &Api, e: &Event, ns: u8, phases: &Phases) -> bool {
        if api.op == Op::Alloc && self.last_device != Some(e.device) {
            self.last_device = Some(e.device);
            self.devices.insert(e.device);
        }
        if self.filter.device.is_none() && self.filter.phase.is_none() {
            return true;
        }
        match api.op {
            Op::Free => !(e.result == 0 && self.ignored.remove(&(ns, e.addr))),
            Op::Alloc => {
                let device_ok = self.filter.device.is_none_or(|d| d == e.device);
                let phase_ok = match &self.filter.phase {
                    Some(p) => phases.in_phase(e.tid, p),
                    None => true,
                };
                if e.result == 0 {
                    if device_ok && phase_ok {
                        self.ignored.remove(&(ns, e.addr));
                    } else {
                        self.ignored.insert((ns, e.addr));
                    }
                }
                if !(device_ok && phase_ok) {
                    self.filtered_out += 1;
                }
                device_ok && phase_ok
            }
        }
    }

    /// Devices of every allocation call (-1: host memory), whatever the filter, sorted.
    pub fn alloc_devices(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.devices.iter().copied().collect();
        v.sort_unstable();
        v
    }
}
