//! The summary of one trace as data: what `build` fills in and `render` and JSON show.


use gpumemtrace_format::MemKind;
use serde::Serialize;

use crate::report::pools::{PoolAtFailure, PoolReport};
use crate::report::sites::{GrowthSite, Site};
use crate::symbolize::Located;

#[derive(Clone, Debug)]
pub struct Options {
    pub json: bool,
    /// Items per list; `None`: 10 in the terminal, all in JSON.
    pub top: Option<usize>,
    /// Frames shown per site in the terminal, starting at the site.
    pub frames: usize,
    pub device: Option<i32>,
    /// Only allocations made in this phase (see docs/format.md, "Phases").
    pub phase: Option<String>,
    /// `--module`, `--from`, `--to` (its device and phase are the fields above).
    pub filter: crate::model::Filter,
    /// Temporary allocations: freed with at most this many other allocations of their thread
    /// in between (see `model::temporary`).
    pub temporary_threshold: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            json: false,
            top: None,
            frames: 1,
            device: None,
            phase: None,
            filter: crate::model::Filter::default(),
            temporary_threshold: 1,
        }
    }
}

pub(super) const DEFAULT_TOP: usize = 10;


#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub path: String,
    pub pid: u32,
    pub exe: String,
    pub args: Vec<String>,
    pub status: &'static str,
    pub stopped_at: Option<u64>,
    pub error: Option<String>,
    pub events: u64,
    pub dropped: u64,
    pub notices: Vec<String>,
    pub groups: Vec<GroupReport>,
    pub devices: Vec<DeviceReport>,
    pub failures: Vec<FailureReport>,
    /// Post-mortem of the last failed allocation: live memory on its device at that moment.
    pub last_failure_live: Vec<LiveGroupReport>,
    pub unknown_frees: Vec<FreeReport>,
    /// Per device with blocks (PyTorch's caching allocator): segments and blocks.
    pub pools: Vec<PoolReport>,
    /// Allocations freed again at once (see `model::temporary`); absent when there were none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temporary: Option<super::temporary::TemporaryReport>,
    /// A final Stats record was read: the tracer shut down cleanly.
    #[serde(skip)]
    pub(super) finished: bool,
    #[serde(skip)]
    pub(super) unknown_api_events: u64,
    #[serde(skip)]
    pub(super) more_failures: usize,
    /// Out-of-memory failures, and the other errors by name (see `units::classify`).
    #[serde(skip)]
    pub(super) out_of_memory: u64,
    #[serde(skip)]
    pub(super) other_errors: Vec<ErrorTally>,
    /// Includes bad frees the model only counted.
    #[serde(skip)]
    pub(super) more_unknown_frees: u64,
}

#[derive(Debug, Serialize)]
pub struct GroupReport {
    pub device: i32,
    pub kind: &'static str,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    pub failed: u64,
    pub peak_bytes: u64,
    pub peak_time_ns: u64,
    pub peak_sites: Vec<Site>,
    pub live_bytes: u64,
    pub live_count: u64,
    /// For Python programs: live when the program finished, before the interpreter's shutdown
    /// freed its objects; `leak_sites` then describe this live set.
    pub live_at_python_exit_bytes: Option<u64>,
    pub live_at_python_exit_count: Option<u64>,
    pub leak_sites: Vec<Site>,
    /// Sites whose live bytes kept rising over the run, most gained first.
    pub growing_sites: Vec<GrowthSite>,
    #[serde(skip)]
    pub(super) more_growing_sites: usize,
    #[serde(skip)]
    pub(super) mem_kind: MemKind,
    #[serde(skip)]
    pub(super) double_allocs: u64,
    #[serde(skip)]
    pub(super) out_of_memory: u64,
    #[serde(skip)]
    pub(super) other_errors: Vec<ErrorTally>,
    /// Live allocations at the peak.
    #[serde(skip)]
    pub(super) peak_count: u64,
    #[serde(skip)]
    pub(super) more_peak_sites: usize,
    #[serde(skip)]
    pub(super) more_leak_sites: usize,
    #[serde(skip)]
    pub(super) occupies_gpu: bool,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub device: i32,
    pub peak_bytes: u64,
    pub peak_time_ns: u64,
    pub live_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct FailureReport {
    pub api: String,
    pub device: i32,
    pub kind: &'static str,
    pub size: u64,
    pub result: u32,
    /// The result's name as the API calls it (`CUDA_ERROR_OUT_OF_MEMORY`, `cudaErrorMemoryAllocation`).
    pub error: Option<&'static str>,
    /// `out-of-memory`, `capability-probe` (cuMemCreate asking whether a handle type is
    /// supported: not a failed allocation) or `other`.
    pub class: &'static str,
    pub time_ns: u64,
    pub live_bytes_on_device: u64,
    /// The caching allocator's state on the device then (with blocks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolAtFailure>,
    #[serde(flatten)]
    pub located: Located,
}

/// Failed calls of one API with one result that were not out of memory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ErrorTally {
    pub probe: bool,
    pub label: String,
    pub api: String,
    pub n: u64,
}

#[derive(Debug, Serialize)]
pub struct LiveGroupReport {
    pub device: i32,
    pub kind: &'static str,
    pub live_bytes: u64,
    pub live_count: u64,
    pub sites: Vec<Site>,
    #[serde(skip)]
    pub(super) more_sites: usize,
}

#[derive(Debug, Serialize)]
pub struct FreeReport {
    pub api: String,
    pub addr: u64,
    pub result: u32,
    pub time_ns: u64,
    #[serde(flatten)]
    pub located: Located,
}
