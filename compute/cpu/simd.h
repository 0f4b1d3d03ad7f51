/* simd.h — LOOM_CPU_CLONES: compile a hot kernel for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA)
 * and the baseline, and let the loader pick at run time (GCC/Clang target_clones, ELF ifunc). */
#ifndef LOOM_SIMD_H
#define LOOM_SIMD_H

// The library is built for the baseline ISA so that one binary runs on every x86-64 machine;
// the few loops that are worth it (elementwise transcendental kernels, attention tiles) get AVX2
// and AVX-512 copies too. The v4 copy was worth 1.5-2.4% of a train_gpt step on a Zen 4 core
// (gelu, layernorm, cross-entropy, AdamW, attention softmax; 40-step runs, two pairs). All copies
// compute the same bits: lane-wise IEEE operations, and configure turns contraction off.
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

#endif
