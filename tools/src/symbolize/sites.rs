//! The call site of a stack: the innermost frame that is the program's own code, not the
//! CUDA libraries' or the tracer's.

use super::native::Frame;

/// Modules whose frames are never the call site: CUDA, the tracer, and PyTorch's allocator
/// core (`libc10.so`, `libc10_cuda.so`: the caching allocator itself).
const SKIPPED_MODULES: [&str; 5] = ["libcuda.so", "libcudart", "libgpumemtrace", "libnvidia-", "libc10"];

/// Functions that only make room for a tensor (PyTorch's `at::empty` and friends, the
/// allocator's entry points): the site is whoever asked for the tensor.
const ALLOCATOR_FUNCTIONS: [&str; 8] = [
    "c10::",
    "at::empty",
    "at::detail::empty",
    "at::native::empty",
    "at::_ops::empty",
    "at::_ops::new_empty",
    "at::TensorBase::",
    "at::native::resize_",
];

/// The framework op an allocation was made for, from its native frames (innermost first):
/// the innermost ATen operator other than the tensor factories (`at::_ops::mm::call` ->
/// `aten::mm`) and the innermost autograd node (`...::generated::MmBackward0::apply`),
/// as `aten::mm in MmBackward0`.
pub fn op_name(frames: &[Frame]) -> Option<String> {
    let mut op = None;
    let mut node = None;
    for f in frames {
        let Some(func) = f.function.as_deref() else { continue };
        if op.is_none() {
            if let Some(rest) = func.strip_prefix("at::_ops::") {
                let name = rest.split("::").next().unwrap_or("");
                let factory = name.starts_with("empty") || name.starts_with("new_empty") || name.starts_with("_empty");
                if !name.is_empty() && !factory {
                    op = Some(format!("aten::{name}"));
                }
            }
        }
        if node.is_none() {
            // `...::generated::MmBackward0::apply(...)`, `...::generated::ReluBackward0_apply_functional(...)`;
            // not the helpers in `generated::details::`.
            if let Some(i) = func.find("autograd::generated::") {
                let rest = &func[i + "autograd::generated::".len()..];
                let name = rest.split(['(', ':', '<']).next().unwrap_or("");
                let name = name.strip_suffix("_apply_functional").unwrap_or(name);
                if !name.is_empty() && name != "details" {
                    node = Some(name.to_string());
                }
            }
        }
    }
    match (op, node) {
        (Some(o), Some(n)) => Some(format!("{o} in {n}")),
        (o, n) => o.or(n),
    }
}

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
    if ALLOCATOR_FUNCTIONS.iter().any(|p| func.starts_with(p)) {
        return true;
    }
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
    let Some(first) = frames.iter().position(|f| !is_cuda_or_tracer(f)) else { return 0 };
    // Inside PyTorch's own libraries (an op's kernel wrapper), the program that called the op
    // is the better site when there is one: a caller outside torch that is not the C/C++
    // runtime starting the thread. On autograd's threads there is none: the op stays.
    if in_module(&frames[first], TORCH_MODULES) {
        if let Some(i) = frames[first..]
            .iter()
            .position(|f| !is_cuda_or_tracer(f) && !in_module(f, TORCH_MODULES) && !in_module(f, RUNTIME_MODULES))
        {
            return first + i;
        }
    }
    first
}

/// PyTorch's libraries beyond the allocator (`libtorch_cpu.so`, `libtorch_cuda.so`, ...).
const TORCH_MODULES: &[&str] = &["libtorch"];
/// What starts threads and calls `main`: never a call site when anything else is.
const RUNTIME_MODULES: &[&str] = &["libc.so", "libstdc++", "libpthread", "ld-linux", "libgcc_s", "libpython", "python3"];

fn in_module(f: &Frame, prefixes: &[&str]) -> bool {
    f.module_name().is_some_and(|m| prefixes.iter().any(|p| m.starts_with(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_torch_the_site_is_the_program_that_called_the_op() {
        let stack = [
            frame(Some("c10::cuda::CUDACachingAllocator::malloc(unsigned long)"), "/x/libc10_cuda.so"),
            frame(Some("at::_ops::mm::call(at::Tensor const&)"), "/x/libtorch_cuda.so"),
            frame(Some("matmul"), "/app/prog"),
            frame(Some("main"), "/app/prog"),
        ];
        assert_eq!(site_index(&stack), 2);
        // On autograd's thread only the C++ runtime calls torch: the op is the site.
        let thread = [
            stack[0].clone(),
            stack[1].clone(),
            frame(Some("execute_native_thread_routine"), "/usr/lib/libstdc++.so.6"),
            frame(Some("start_thread"), "/usr/lib/libc.so.6"),
        ];
        assert_eq!(site_index(&thread), 1);
    }

    #[test]
    fn ops_are_named_from_aten_operators_and_autograd_nodes() {
        let f = |name: &str| frame(Some(name), "/x/libtorch_cpu.so");
        let stack = [
            f("c10::cuda::CUDACachingAllocator::malloc(unsigned long)"),
            f("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)"),
            f("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            f("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
            f("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
        ];
        assert_eq!(op_name(&stack).as_deref(), Some("aten::mm in MmBackward0"));
        assert_eq!(op_name(&stack[..3]).as_deref(), Some("aten::mm"));
        assert_eq!(op_name(&stack[..2]), None, "a factory alone names no op");
        assert_eq!(op_name(&[stack[3].clone()]).as_deref(), Some("MmBackward0"));
        let relu = f("torch::autograd::generated::ReluBackward0_apply_functional(std::vector<at::Tensor>&&)");
        assert_eq!(op_name(&[relu]).as_deref(), Some("ReluBackward0"));
        let helper = f("torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&)");
        assert_eq!(op_name(&[stack[2].clone(), helper]).as_deref(), Some("aten::mm"));
    }

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
            frame(Some("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)"), "/x/torch/lib/libc10_cuda.so"),
            frame(Some("at::detail::empty_generic(c10::ArrayRef<long>)"), "/x/torch/lib/libtorch_cpu.so"),
            frame(Some("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)"), "/x/torch/lib/libtorch_cpu.so"),
        ];
        for f in &skipped {
            assert!(is_cuda_or_tracer(f), "{f:?}");
        }
        let kept = [
            frame(Some("cube_root"), "/app/train"), // `cu` + lowercase
            frame(Some("load_weights"), "/app/train"),
            frame(None, "/app/libcudnn_ops.so.9"),
            frame(Some("main"), "/usr/lib/libcuda_helpers_of_mine.so"), // not libcuda.so
            frame(Some("at::native::structured_mm_out_cuda::impl(at::Tensor const&)"), "/x/torch/lib/libtorch_cuda.so"),
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
