//! Which events a report counts (`--device`, `--phase`, `--module`, `--from`/`--to`). Frees
//! count when the allocation they free counted.

use gpumemtrace_format::{Api, Event, Op, Record};
use rustc_hash::FxHashSet;

use super::phases::Phases;
use super::stackmatch::StackMatch;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only allocations made on this device (-1: host memory).
    pub device: Option<i32>,
    /// Only allocations made while this phase was open on the calling thread (innermost or
    /// enclosing range), or, on a thread with no open range, while it was the process mark.
    pub phase: Option<String>,
    /// Only allocations whose stack has a frame in a module (native: the loaded object; Python:
    /// the code's file) whose file name contains this.
    pub module: Option<String>,
    /// Only allocations made at or after this time (nanoseconds since tracing started)...
    pub from_ns: Option<u64>,
    /// ... and before this one.
    pub to_ns: Option<u64>,
}

impl Filter {
    /// Whether the filter admits every event.
    pub fn is_empty(&self) -> bool {
        self.device.is_none()
            && self.phase.is_none()
            && self.module.is_none()
            && self.from_ns.is_none()
            && self.to_ns.is_none()
    }
}

/// A filter as the replay applies it.
#[derive(Default)]
pub struct Admission {
    filter: Filter,
    /// The filter admits everything (asked once, not at every event).
    everything: bool,
    /// `--module`'s verdicts on stacks.
    modules: Option<StackMatch>,
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
        let modules = filter.module.as_deref().map(StackMatch::new);
        Admission { everything: filter.is_empty(), filter, modules, ..Admission::default() }
    }

    /// Takes what `--module` needs from a record (modules, stacks, Python code and stacks).
    pub fn context(&mut self, rec: &Record) {
        let Some(m) = &mut self.modules else { return };
        match rec {
            Record::Module(r) => m.module(r),
            Record::Stack(r) => m.stack(r),
            Record::PyCode(r) => m.py_code(r),
            Record::PyStack(r) => m.py_stack(r),
            _ => {}
        }
    }

    /// Stack key `key` stands for native stack `native` with a Python stack.
    pub fn pair(&mut self, key: u32, native: u32) {
        if let Some(m) = &mut self.modules {
            m.pair(key, native);
        }
    }

    /// Whether the filter admits the event (`ns`: its pointer namespace).
    pub fn admit(&mut self, api: &Api, e: &Event, ns: u8, phases: &Phases) -> bool {
        if api.op == Op::Alloc && self.last_device != Some(e.device) {
            self.last_device = Some(e.device);
            self.devices.insert(e.device);
        }
        if self.everything {
            return true;
        }
        match api.op {
            Op::Free => !(e.result == 0 && self.ignored.remove(&(ns, e.addr))),
            Op::Alloc => {
                let f = &self.filter;
                let ok = f.device.is_none_or(|d| d == e.device)
                    && f.from_ns.is_none_or(|t| e.time_ns >= t)
                    && f.to_ns.is_none_or(|t| e.time_ns < t)
                    && f.phase.as_ref().is_none_or(|p| phases.in_phase(e.tid, p))
                    && self.modules.as_mut().is_none_or(|m| m.admits(e.stack, e.pystack));
                if e.result == 0 {
                    if ok {
                        self.ignored.remove(&(ns, e.addr));
                    } else {
                        self.ignored.insert((ns, e.addr));
                    }
                }
                if !ok {
                    self.filtered_out += 1;
                }
                ok
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

/// A time on the command line: `1.5s`, `300ms`, `20us`, `100ns`, `2m`, or plain seconds (`2.5`),
/// as nanoseconds.
pub fn parse_time(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("{s:?}: not a time (e.g. 1.5s, 300ms)"));
    }
    let scale = match unit.trim() {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        "m" | "min" => 60e9,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use s, ms, us, ns or m, e.g. 1.5s)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?}: not a time (e.g. 1.5s, 300ms)"))?;
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_take_units() {
        assert_eq!(parse_time("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_time("3"), Ok(3_000_000_000));
        assert_eq!(parse_time("300ms"), Ok(300_000_000));
        assert_eq!(parse_time("20us"), Ok(20_000));
        assert_eq!(parse_time("2m"), Ok(120_000_000_000));
        assert!(parse_time("-1s").is_err());
        assert!(parse_time("1.5h").is_err());
        assert!(parse_time("soon").is_err());
    }
}
