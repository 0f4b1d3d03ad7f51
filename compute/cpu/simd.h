/* simd.h — LOOM_CPU_CLONES: compile a hot kernel for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA)
 * and the baseline, and let the loader pick at run time (GCC/Clang target_clones, ELF ifunc). */
#ifndef LOOM_SIMD_H
#define LOOM_SIMD_H

// The library is built for the baseline ISA so that one binary runs on every x86-64 machine;
// the few loops that are worth it (elementwise transcendental kernels, attention tiles) get AVX2
// and AVX-512 copies too. The v4 copy was worth 1.5-2.4% of a train_gpt step on a Zen 4 core
// (gelu, layernorm, cross-entropy, AdamW, attention softmax; 40-step runs, two pairs). All copies
// compute the same bits: lane-wise IEEE operations, and configure turns contraction off, except
// in the kernels marked LOOM_CONTRACT below.
// Elsewhere (other architectures, compilers without the attribute) the macro is empty.
//
// Put it only on static functions and call them from the public loom_cpu_ entry point: GCC
// gives a cloned function's ifunc resolver ("name.resolver") the visibility of the function, so
// a cloned public function would export its resolver too (tests/unit/exports.sh checks).
#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define LOOM_CPU_CLONES                                                                            \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef LOOM_CPU_CLONES
#define LOOM_CPU_CLONES
#endif

// Contraction on for one function (GCC; clang keeps the file's setting): a * b + c becomes one
// fused multiply-add where the target has FMA. The FMA clones (x86-64-v3, v4) of such a kernel
// then agree with each other but not with the baseline clone, in the last bits, as BLAS kernels
// differ between machines. Used where the multiply-adds are the work: the attention
// micro-kernels and GELU's polynomials. Ranks on the same kind of CPU still agree bit for bit.
#if defined(__GNUC__) && !defined(__clang__)
#define LOOM_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define LOOM_CONTRACT
#endif

// A static helper of a cloned kernel: inlined into every clone. A helper that stays a call runs
// its baseline (SSE2) code from the AVX-512 clone too.
#if defined(__GNUC__) || defined(__clang__)
#define LOOM_CLONE_HELPER static inline __attribute__((always_inline))
#else
#define LOOM_CLONE_HELPER static inline
#endif

#endif
