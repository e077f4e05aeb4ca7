//! Configuration from the environment, read once when tracing starts. Invalid values are
//! reported on stderr (once) and replaced by the default; they never stop the host program.
//! Every environment variable the shim reads is read here. Depends on nothing else in the crate.

/// Default native stack depth.
pub const DEFAULT_FRAMES: usize = 128;

pub struct Config {
    /// `GPUMEMTRACE_OUTPUT`: a file name (`%p` = pid) or a directory (existing, or ending in '/').
    pub output: Option<String>,
    /// `GPUMEMTRACE_FRAMES`: native frames per event, 0 to the format's limit.
    pub max_frames: usize,
    /// `GPUMEMTRACE_DISABLE=1`: record nothing, create nothing.
    pub disabled: bool,
    /// `GPUMEMTRACE_FILE_MODE`: permission bits of new trace files (octal), default 0600.
    pub file_mode: u32,
    /// `RANK` / `LOCAL_RANK` as torchrun-style launchers set them: part of the trace's name.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    /// Testing knobs (documented as such), read in debug builds only (always 0 in release
    /// builds): slow the writer down by this many microseconds per batch
    /// (`GPUMEMTRACE_TEST_WRITER_DELAY_US`), panic while recording the Nth event
    /// (`GPUMEMTRACE_TEST_PANIC_AT`).
    pub test_writer_delay_us: u64,
    /// `GPUMEMTRACE_TEST_EVENT_DELAY_US`: the writer sleeps this long per event it writes (a
    /// writer short of CPU, working slowly through a backlog).
    pub test_event_delay_us: u64,
    pub test_panic_at: u64,
    /// Order keys are process-wide numbers even where the clock could order calls (the path
    /// of hosts with a coarse clock, tested on any host).
    pub test_numbered_keys: bool,
    /// `GPUMEMTRACE_PYTHON=0`: no Python stacks (native stacks only).
    pub python: bool,
    /// `GPUMEMTRACE_INTERPRETER_FRAMES=1`: native stacks go on through the interpreter when the
    /// event has a Python stack. By default they end at the first interpreter frame: below it
    /// they are the interpreter's own (the Python stack says what ran there), and walking them
    /// is most of an event's cost under PyTorch.
    pub interpreter_frames: bool,
    /// `GPUMEMTRACE_UNWINDER=backtrace`: native stacks by libgcc's unwinder (the `backtrace`
    /// crate: the reference, ~100 ns a frame) instead of the fast one (cached DWARF rules,
    /// src/fastunwind.rs; the default, x86-64 only).
    pub backtrace_unwinder: bool,
    /// `GPUMEMTRACE_COMPRESS=0`: records written as they are, not as a zstd stream (docs/format.md).
    pub compress: bool,
    /// `GPUMEMTRACE_WRITE_THREAD=1`/`0`: batches are compressed and written on a thread of
    /// their own, or on the writer's; unset: on their own once the event rate is high, on a
    /// host of at least four cores (src/sink.rs).
    pub write_thread: Option<bool>,
    /// `GPUMEMTRACE_JOURNAL=0`: the rings between hooks and writer live in anonymous memory,
    /// not in a file beside the trace; a process that dies by SIGKILL then loses what its
    /// writer had not written yet.
    pub journal: bool,
    /// `GPUMEMTRACE_QUIET=1`: no line on stderr at exit naming the trace.
    pub quiet: bool,
    /// `GPUMEMTRACE_AGGREGATE=1`: the trace holds per-site summaries, not every event
    /// (src/aggregate.rs, docs/format.md).
    pub aggregate: bool,
    /// `GPUMEMTRACE_SELF_TIME=1`: the time hooks add, by part, measured and written at the end
    /// of the trace (src/selftime.rs).
    pub self_time: bool,
}

/// A switch's value, `None` when it is neither on nor off.
pub fn parse_flag(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "0" | "false" | "no" | "off" => Some(false),
        "1" | "true" | "yes" | "on" => Some(true),
        _ => None,
    }
}

impl Config {
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok(), |msg| eprintln!("gpumemtrace: {msg}"))
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>, warn: impl Fn(&str)) -> Config {
        // A number in `0..=max` (in `radix`), or the default with a warning.
        let number = |name: &str, radix: u32, max: u64, default: u64| -> u64 {
            let Some(v) = get(name) else { return default };
            match u64::from_str_radix(v.trim(), radix) {
                Ok(n) if n <= max => n,
                _ => {
                    let (shown_max, shown_default) = if radix == 8 {
                        (format!("{max:o}"), format!("{default:o}"))
                    } else {
                        (max.to_string(), default.to_string())
                    };
                    warn(&format!("{name}={v:?} is not a number from 0 to {shown_max}; using {shown_default}"));
                    default
                }
            }
        };
        let max = gpumemtrace_format::MAX_FRAMES as u64;
        let max_frames = number("GPUMEMTRACE_FRAMES", 10, max, DEFAULT_FRAMES as u64) as usize;
        let mut file_mode = number("GPUMEMTRACE_FILE_MODE", 8, 0o777, 0o600) as u32;
        if file_mode & 0o600 != 0o600 {
            warn(&format!("GPUMEMTRACE_FILE_MODE={file_mode:o} must let the owner read and write; using 600"));
            file_mode = 0o600;
        }
        let rank = |name: &str| get(name).and_then(|v| v.trim().parse::<u32>().ok());
        // A switch: 1/true/yes/on or 0/false/no/off in any case; anything else warns.
        let flag = |name: &str, default: bool, meaning: &str| -> bool {
            let Some(v) = get(name).filter(|v| !v.trim().is_empty()) else { return default };
            match parse_flag(&v) {
                Some(b) => b,
                None => {
                    warn(&format!("{name}={v:?} should be 1/true/yes/on or 0/false/no/off; {meaning}"));
                    default
                }
            }
        };
        let disabled = flag("GPUMEMTRACE_DISABLE", false, "tracing stays on");
        let python = flag("GPUMEMTRACE_PYTHON", true, "Python stacks stay on");
        let interpreter_frames = flag("GPUMEMTRACE_INTERPRETER_FRAMES", false, "the interpreter's native frames are left out");
        let output = get("GPUMEMTRACE_OUTPUT").filter(|s| !s.is_empty());
        let backtrace_unwinder = get("GPUMEMTRACE_UNWINDER").is_some_and(|v| v == "backtrace");
        let compress = flag("GPUMEMTRACE_COMPRESS", true, "traces stay compressed");
        let write_thread = get("GPUMEMTRACE_WRITE_THREAD").filter(|v| !v.trim().is_empty()).and_then(|v| {
            let on = parse_flag(&v);
            if on.is_none() {
                warn(&format!("GPUMEMTRACE_WRITE_THREAD={v:?} should be 1/true/yes/on or 0/false/no/off; the host decides"));
            }
            on
        });
        let journal = flag("GPUMEMTRACE_JOURNAL", true, "the journal stays on");
        let quiet = flag("GPUMEMTRACE_QUIET", false, "the trace is named on stderr at exit");
        let aggregate = flag("GPUMEMTRACE_AGGREGATE", false, "every event is written");
        let self_time = flag("GPUMEMTRACE_SELF_TIME", false, "the hooks' own time is not measured");
        Config {
            output,
            max_frames,
            disabled,
            file_mode,
            rank: rank("RANK"),
            local_rank: rank("LOCAL_RANK"),
            // Test knobs exist in debug builds only (the tests run those): a release build
            // never reads them, so a stray variable cannot slow or stop a real job.
            test_writer_delay_us: if cfg!(debug_assertions) { number("GPUMEMTRACE_TEST_WRITER_DELAY_US", 10, 10_000_000, 0) } else { 0 },
            test_event_delay_us: if cfg!(debug_assertions) { number("GPUMEMTRACE_TEST_EVENT_DELAY_US", 10, 1_000_000, 0) } else { 0 },
            test_panic_at: if cfg!(debug_assertions) { number("GPUMEMTRACE_TEST_PANIC_AT", 10, u64::MAX, 0) } else { 0 },
            test_numbered_keys: cfg!(debug_assertions) && flag("GPUMEMTRACE_TEST_NUMBERED_KEYS", false, "keys are timestamps where the clock allows"),
            python,
            interpreter_frames,
            backtrace_unwinder,
            compress,
            write_thread,
            journal,
            quiet,
            aggregate,
            self_time,
        }
    }
}

/// `GPUMEMTRACE_DISABLE` as NVTX's injection reads it when the program makes its first NVTX
/// call (possibly before tracing starts): true only for an explicit "on"; no warning.
pub fn disabled_for_nvtx() -> bool {
    std::env::var("GPUMEMTRACE_DISABLE").ok().and_then(|v| parse_flag(&v)) == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn cfg(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let warnings = RefCell::new(Vec::new());
        let c = Config::from_lookup(
            |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
            |m| warnings.borrow_mut().push(m.to_string()),
        );
        (c, warnings.into_inner())
    }

    #[test]
    fn defaults_apply_without_variables() {
        let (c, w) = cfg(&[]);
        assert_eq!((c.max_frames, c.disabled, c.output), (128, false, None));
        assert!(w.is_empty());
    }

    #[test]
    fn invalid_values_warn_and_fall_back() {
        let (c, w) = cfg(&[("GPUMEMTRACE_FRAMES", "lots"), ("GPUMEMTRACE_DISABLE", "sometimes")]);
        assert_eq!((c.max_frames, c.disabled), (128, false));
        assert_eq!(w.len(), 2, "{w:?}");
        let (c, w) = cfg(&[("GPUMEMTRACE_FRAMES", "5000")]);
        assert_eq!(c.max_frames, 128);
        assert!(w[0].contains("0 to 1024"), "{w:?}");
        let (c, w) = cfg(&[("GPUMEMTRACE_FILE_MODE", "0400")]);
        assert_eq!(c.file_mode, 0o600);
        assert!(w[0].contains("owner read and write"), "{w:?}");
        let (c, w) = cfg(&[("GPUMEMTRACE_FILE_MODE", "9")]);
        assert_eq!((c.file_mode, w.len()), (0o600, 1));
    }

    #[test]
    fn valid_values_are_taken() {
        let (c, w) = cfg(&[
            ("GPUMEMTRACE_FRAMES", "16"),
            ("GPUMEMTRACE_DISABLE", "1"),
            ("GPUMEMTRACE_OUTPUT", "/tmp/x/"),
            ("GPUMEMTRACE_FILE_MODE", "640"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
        ]);
        assert_eq!((c.max_frames, c.disabled, c.output.as_deref()), (16, true, Some("/tmp/x/")));
        assert_eq!((c.file_mode, c.rank, c.local_rank), (0o640, Some(3), Some(1)));
        assert!(w.is_empty());
    }

    #[test]
    fn switches_take_the_usual_words_in_any_case() {
        for on in ["1", "true", "YES", "On", " on "] {
            assert!(cfg(&[("GPUMEMTRACE_DISABLE", on)]).0.disabled, "{on}");
        }
        for off in ["0", "False", "no", "OFF"] {
            let (c, w) = cfg(&[("GPUMEMTRACE_DISABLE", off), ("GPUMEMTRACE_PYTHON", off)]);
            assert!(!c.disabled && !c.python && w.is_empty(), "{off}");
        }
        let (c, w) = cfg(&[("GPUMEMTRACE_DISABLE", ""), ("GPUMEMTRACE_PYTHON", " ")]);
        assert!(!c.disabled && c.python && w.is_empty(), "empty means the default");
        assert!(cfg(&[("GPUMEMTRACE_UNWINDER", "backtrace")]).0.backtrace_unwinder);
        assert!(!cfg(&[("GPUMEMTRACE_UNWINDER", "fast")]).0.backtrace_unwinder);
        let (c, w) = cfg(&[("GPUMEMTRACE_INTERPRETER_FRAMES", "2")]);
        assert!(!c.interpreter_frames);
        assert!(w[0].contains("GPUMEMTRACE_INTERPRETER_FRAMES"), "{w:?}");
    }

    #[test]
    fn test_knobs_are_read_in_debug_builds_only() {
        let (c, w) = cfg(&[
            ("GPUMEMTRACE_TEST_WRITER_DELAY_US", "5"),
            ("GPUMEMTRACE_TEST_EVENT_DELAY_US", "7"),
            ("GPUMEMTRACE_TEST_PANIC_AT", "3"),
            ("GPUMEMTRACE_TEST_NUMBERED_KEYS", "1"),
        ]);
        let knobs = (c.test_writer_delay_us, c.test_event_delay_us, c.test_panic_at, c.test_numbered_keys);
        if cfg!(debug_assertions) {
            assert_eq!(knobs, (5, 7, 3, true));
        } else {
            assert_eq!(knobs, (0, 0, 0, false), "a release build ignores test knobs");
        }
        assert!(w.is_empty());
    }
}
