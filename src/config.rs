//! Configuration from the environment, read once when tracing starts. Invalid values are
//! reported on stderr (once) and replaced by the default; they never stop the host program.

/// Default native stack depth.
pub const DEFAULT_FRAMES: usize = 64;

pub struct Config {
    /// `GPUMEMTRACE_OUTPUT`: a file name (`%p` = pid) or a directory (existing, or ending in '/').
    pub output: Option<String>,
    /// `GPUMEMTRACE_FRAMES`: native frames per event, 0 to the format's limit.
    pub max_frames: usize,
    /// `GPUMEMTRACE_DISABLE=1`: record nothing, create nothing.
    pub disabled: bool,
    /// `GPUMEMTRACE_PYTHON=0`: no Python stacks (native stacks only).
    pub python: bool,
}

impl Config {
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok(), |msg| eprintln!("gpumemtrace: {msg}"))
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>, warn: impl Fn(&str)) -> Config {
        let max = gpumemtrace_format::MAX_FRAMES;
        let max_frames = match get("GPUMEMTRACE_FRAMES") {
            None => DEFAULT_FRAMES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= max => n,
                _ => {
                    warn(&format!(
                        "GPUMEMTRACE_FRAMES={v:?} is not a number from 0 to {max}; using {DEFAULT_FRAMES}"
                    ));
                    DEFAULT_FRAMES
                }
            },
        };
        let disabled = match get("GPUMEMTRACE_DISABLE").as_deref().map(str::trim) {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                warn(&format!("GPUMEMTRACE_DISABLE={v:?} should be 0 or 1; tracing stays on"));
                false
            }
        };
        let python = match get("GPUMEMTRACE_PYTHON").as_deref().map(str::trim) {
            None | Some("") | Some("1") => true,
            Some("0") => false,
            Some(v) => {
                warn(&format!("GPUMEMTRACE_PYTHON={v:?} should be 0 or 1; Python stacks stay on"));
                true
            }
        };
        let output = get("GPUMEMTRACE_OUTPUT").filter(|s| !s.is_empty());
        Config { output, max_frames, disabled, python }
    }
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
        assert_eq!((c.max_frames, c.disabled, c.output), (64, false, None));
        assert!(w.is_empty());
    }

    #[test]
    fn invalid_values_warn_and_fall_back() {
        let (c, w) = cfg(&[("GPUMEMTRACE_FRAMES", "lots"), ("GPUMEMTRACE_DISABLE", "yes")]);
        assert_eq!((c.max_frames, c.disabled), (64, false));
        assert_eq!(w.len(), 2, "{w:?}");
        let (c, w) = cfg(&[("GPUMEMTRACE_FRAMES", "5000")]);
        assert_eq!(c.max_frames, 64);
        assert!(w[0].contains("0 to 1024"), "{w:?}");
    }

    #[test]
    fn valid_values_are_taken() {
        let (c, w) = cfg(&[("GPUMEMTRACE_FRAMES", "16"), ("GPUMEMTRACE_DISABLE", "1"), ("GPUMEMTRACE_OUTPUT", "/tmp/x/")]);
        assert_eq!((c.max_frames, c.disabled, c.output.as_deref()), (16, true, Some("/tmp/x/")));
        assert!(w.is_empty());
    }
}
