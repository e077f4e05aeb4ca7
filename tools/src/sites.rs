//! The call site of a stack: the innermost frame that is the program's own code, not the
//! CUDA libraries' or the tracer's.

use crate::symbolize::Frame;

/// Modules whose frames are never the call site.
const SKIPPED_MODULES: [&str; 4] = ["libcuda.so", "libcudart", "libgpumemtrace", "libnvidia-"];

/// True for frames of the CUDA libraries and the tracer. Function names catch the CUDA
/// runtime when it is linked statically into the program, and the inline templates of
/// `cuda_runtime.h` (`cudaMalloc<float>`) that end up in the caller's own code.
pub fn is_cuda_or_tracer(f: &Frame) -> bool {
    if f.module_name()
        .is_some_and(|m| SKIPPED_MODULES.iter().any(|p| m.starts_with(p)))
    {
        return true;
    }
    let Some(func) = f.function.as_deref() else {
        return false;
    };
    let mut c = func.chars();
    func.starts_with("cuda")
        || (c.next() == Some('c')
            && c.next() == Some('u')
            && c.next().is_some_and(|u| u.is_ascii_uppercase()))
        || func.starts_with("__cudart")
        || func.starts_with("libcudart")
}

/// Index of the call site in a symbolized stack (innermost first): the first frame that is
/// not CUDA or tracer code, or the innermost frame when all are.
pub fn site_index(frames: &[Frame]) -> usize {
    frames
        .iter()
        .position(|f| !is_cuda_or_tracer(f))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: Option<&str>, module: &str) -> Frame {
        Frame {
            function: function.map(str::to_owned),
            module: Some(module.to_owned()),
            ..Frame::default()
        }
    }

    #[test]
    fn skips_cuda_and_tracer_frames() {
        let skipped = [
            frame(
                Some("gpumemtrace::hooks::cudaMalloc"),
                "/opt/lib/libgpumemtrace.so",
            ),
            frame(None, "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            frame(Some("foo"), "/usr/local/cuda/lib64/libcudart.so.12"),
            frame(Some("bar"), "/usr/lib/libnvidia-ml.so.1"),
            frame(Some("cudaMalloc"), "/app/train"),
            frame(Some("cudaMalloc<float>"), "/app/train"),
            frame(Some("cuMemAlloc_v2"), "/app/train"),
            frame(
                Some("cudart::cudaApiMalloc(void**, unsigned long)"),
                "/app/train",
            ),
            frame(Some("__cudart1234"), "/app/train"),
            frame(Some("libcudart_static_4d8b33a1"), "/app/train"),
        ];
        for f in &skipped {
            assert!(is_cuda_or_tracer(f), "{f:?}");
        }
        let kept = [
            frame(Some("cube_root"), "/app/train"), // `cu` + lowercase
            frame(Some("load_weights"), "/app/train"),
            frame(None, "/app/libcudnn_ops.so.9"),
            frame(Some("main"), "/usr/lib/libcuda_helpers_of_mine.so"), // not libcuda.so
        ];
        for f in &kept {
            assert!(!is_cuda_or_tracer(f), "{f:?}");
        }
        let mut stack = skipped.to_vec();
        stack.extend(kept.iter().cloned());
        assert_eq!(site_index(&stack), skipped.len());
        assert_eq!(site_index(&skipped), 0);
        assert_eq!(site_index(&[]), 0);
    }
}
