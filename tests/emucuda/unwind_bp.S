/* Frames for tests/unwind.rs where rbp is not the frame pointer everywhere (prog_unwind_bp.c):
 * written in assembly so that what each frame does with rbp, and its CFI, are exactly known.
 * Each takes x in edi and ends by allocating through leaf_asm (no frame pointer). */
	.text

/* leaf_asm(x): cuMemAlloc(&p, 1024 + x); cuMemFree(p). CFA = rsp-based, rbp untouched. */
	.globl leaf_asm
	.type leaf_asm, @function
leaf_asm:
	.cfi_startproc
	subq $24, %rsp
	.cfi_def_cfa_offset 32
	movq $0, 8(%rsp)
	movl %edi, %esi
	addq $1024, %rsi
	leaq 8(%rsp), %rdi
	call cuMemAlloc_v2@PLT
	movq 8(%rsp), %rdi
	call cuMemFree_v2@PLT
	addq $24, %rsp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size leaf_asm, .-leaf_asm

/* ffi_like(x): libffi's ffi_call_unix64 frame: CFA = rbp + 32, a rule framehop does not cache
 * (it evaluates it each time; one failed evaluation makes it cache CFA = rbp + 16, which here
 * finds a 0 return address). */
	.globl ffi_like
	.type ffi_like, @function
ffi_like:
	.cfi_startproc
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	subq $16, %rsp
	.cfi_def_cfa_offset 32
	movq $0, (%rsp)
	movq $0, 8(%rsp)
	movq %rsp, %rbp
	.cfi_def_cfa %rbp, 32
	call leaf_asm
	movq %rbp, %rsp
	.cfi_def_cfa %rsp, 32
	addq $16, %rsp
	.cfi_def_cfa_offset 16
	popq %rbp
	.cfi_restore %rbp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size ffi_like, .-ffi_like

/* scramble_v(v, x): saves rbp, keeps v in it across leaf_asm(x) (a caller's changing rbp that
 * nothing uses as a frame pointer). CFA = rsp-based, rbp restored from the stack. */
	.globl scramble_v
	.type scramble_v, @function
scramble_v:
	.cfi_startproc
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	movq %rdi, %rbp
	movl %esi, %edi
	call leaf_asm
	popq %rbp
	.cfi_restore %rbp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size scramble_v, .-scramble_v

/* carry_scramble(x): a frame that carries rbp (rsp-based CFA, rbp untouched) around
 * scramble_v(0x1234, x): the rbp that scramble_v saves is the caller's frame pointer. */
	.globl carry_scramble
	.type carry_scramble, @function
carry_scramble:
	.cfi_startproc
	subq $8, %rsp
	.cfi_def_cfa_offset 16
	movl %edi, %esi
	movq $0x1234, %rdi
	call scramble_v
	addq $8, %rsp
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size carry_scramble, .-carry_scramble

/* fp_at(target, x): a frame-pointer frame (CFA = rbp + 16) that moves rsp to `target` (16-aligned,
 * below) before calling carry_scramble(x): the frames inside it are at the same addresses
 * whatever the depth it was called at, only the rbp saved by scramble_v tells them apart. */
	.globl fp_at
	.type fp_at, @function
fp_at:
	.cfi_startproc
	pushq %rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	movq %rsp, %rbp
	.cfi_def_cfa_register %rbp
	movq %rdi, %rsp
	movl %esi, %edi
	call carry_scramble
	movq %rbp, %rsp
	popq %rbp
	.cfi_def_cfa %rsp, 8
	ret
	.cfi_endproc
	.size fp_at, .-fp_at

	.section .note.GNU-stack,"",@progbits
