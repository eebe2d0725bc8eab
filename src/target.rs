//! What the generated code may assume about the machine: the vector instruction set, its
//! width and register count, and the data caches. The optimizer's kernel passes choose their
//! blocking from it and the C writer spells vector operations with it.
//!
//! A [`VectorTarget`] is plain data. The compile stage resolves it from what the C compiler
//! makes of the configured architecture flags (the compile stage's `Target`), so code is never
//! written for instructions the compiler was not told it may use.

use crate::ir::Prec;

/// The vector instruction sets the C writer spells with intrinsics; everything else uses
/// GCC/Clang vector extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// GCC/Clang vector extensions (`__attribute__((vector_size(N)))`), any target.
    Generic,
    /// x86 SSE2: 16-byte vectors, no fused multiply-add.
    Sse2,
    /// x86 AVX2: 32-byte vectors (with FMA when the target has it).
    Avx2,
    /// x86 AVX-512F: 64-byte vectors, FMA, 32 registers.
    Avx512,
    /// AArch64 Advanced SIMD: 16-byte vectors, FMA, 32 registers.
    Neon,
}

/// The resolved target, as the optimizer and the C writer see it. To describe one by hand
/// (tests, cross-compiling), start from [`VectorTarget::default`] and use the setters below
/// (one per field, by the field's name), for example
/// `VectorTarget::default().isa(Isa::Avx2).vector_bytes(32).fma(true)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct VectorTarget {
    /// How vector operations are spelled.
    pub isa: Isa,
    /// The vector width in bytes (4 means no vectors: one scalar).
    pub vector_bytes: usize,
    /// How many vector registers the instruction set has.
    pub registers: usize,
    /// Whether fused multiply-add instructions are available.
    pub fma: bool,
    /// Whether the kernels may use AVX512-BF16's dot products of bfloat16 pairs
    /// (`vdpbf16ps`, 64-byte vectors): contractions of bfloat16 (and fp8) operands into a
    /// single-precision result then multiply pairs of bfloat16 values instead of converting
    /// them to `float` (see `optimize/gemm.rs`).
    pub bf16_dot: bool,
    /// Whether vectors of 64-bit integers multiply in one instruction (AVX-512DQ's
    /// `vpmullq`). Without it the C compiler emulates the product (three 32-bit multiplies,
    /// shifts and adds), so the 64-bit integer kernels keep registers free for its
    /// temporaries (see `optimize/gemm.rs`).
    pub int64_mul: bool,
    /// Level-1 data cache size in bytes.
    pub l1d_bytes: usize,
    /// Level-2 cache size in bytes (per core).
    pub l2_bytes: usize,
    /// The cores a routine's parallel regions can spread over (the machine's available
    /// parallelism): the GEMM kernels cut their columns into blocks enough for them (see
    /// `optimize/gemm.rs`). It changes how work is cut, never a computed bit.
    pub cores: usize,
    /// Spell vector operations with the instruction set's intrinsics rather than GCC/Clang
    /// vector extensions of the same width (same instructions; slower to compile).
    pub intrinsics: bool,
}

impl Default for VectorTarget {
    /// Portable code: 16-byte GCC/Clang vector extensions, 16 registers, typical caches.
    fn default() -> Self {
        VectorTarget {
            isa: Isa::Generic,
            vector_bytes: 16,
            registers: 16,
            fma: false,
            bf16_dot: false,
            int64_mul: false,
            l1d_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            cores: 1,
            intrinsics: false,
        }
    }
}

impl VectorTarget {
    /// Sets [`isa`](VectorTarget::isa).
    pub fn isa(mut self, isa: Isa) -> VectorTarget {
        self.isa = isa;
        self
    }

    /// Sets [`vector_bytes`](VectorTarget::vector_bytes).
    pub fn vector_bytes(mut self, vector_bytes: usize) -> VectorTarget {
        self.vector_bytes = vector_bytes;
        self
    }

    /// Sets [`registers`](VectorTarget::registers).
    pub fn registers(mut self, registers: usize) -> VectorTarget {
        self.registers = registers;
        self
    }

    /// Sets [`fma`](VectorTarget::fma).
    pub fn fma(mut self, fma: bool) -> VectorTarget {
        self.fma = fma;
        self
    }

    /// Sets [`bf16_dot`](VectorTarget::bf16_dot).
    pub fn bf16_dot(mut self, bf16_dot: bool) -> VectorTarget {
        self.bf16_dot = bf16_dot;
        self
    }

    /// Sets [`int64_mul`](VectorTarget::int64_mul).
    pub fn int64_mul(mut self, int64_mul: bool) -> VectorTarget {
        self.int64_mul = int64_mul;
        self
    }

    /// Sets [`l1d_bytes`](VectorTarget::l1d_bytes).
    pub fn l1d_bytes(mut self, l1d_bytes: usize) -> VectorTarget {
        self.l1d_bytes = l1d_bytes;
        self
    }

    /// Sets [`l2_bytes`](VectorTarget::l2_bytes).
    pub fn l2_bytes(mut self, l2_bytes: usize) -> VectorTarget {
        self.l2_bytes = l2_bytes;
        self
    }

    /// Sets [`cores`](VectorTarget::cores).
    pub fn cores(mut self, cores: usize) -> VectorTarget {
        self.cores = cores;
        self
    }

    /// Sets [`intrinsics`](VectorTarget::intrinsics).
    pub fn intrinsics(mut self, intrinsics: bool) -> VectorTarget {
        self.intrinsics = intrinsics;
        self
    }

    /// Lanes of one vector of `prec`'s compute type (`float` for half and single, `double`
    /// for byte and double); 1 when the target has no vectors.
    pub fn lanes(&self, prec: Prec) -> usize {
        let elem = if prec.computes_in_float() { 4 } else { 8 };
        (self.vector_bytes / elem).max(1)
    }

    /// The target with its vectors halved, down to 16 bytes, while a vector (`lanes` of a
    /// target) has more lanes than `n`: the widest vectors that `n` columns or channels fill
    /// (AVX-512 has 32 registers of 32 and of 16 bytes as well).
    pub fn fitting(mut self, n: usize, lanes: impl Fn(&VectorTarget) -> usize) -> VectorTarget {
        while lanes(&self) > n && self.vector_bytes > 16 {
            self.vector_bytes /= 2;
        }
        self
    }

    /// Lanes of one vector of `bits`-bit integers (16, 32 or 64): the vector width, except that
    /// x86 without AVX2 (SSE2 and AVX) has integer vectors of 16 bytes only; 1 when the target
    /// has no vectors.
    pub fn int_lanes(&self, bits: usize) -> usize {
        let bytes = match self.isa {
            _ if self.vector_bytes <= 4 => return 1,
            Isa::Sse2 => self.vector_bytes.min(16),
            _ => self.vector_bytes,
        };
        (bytes * 8 / bits.max(8)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_lanes_follow_the_integer_vector_width() {
        let t = |isa, vector_bytes| VectorTarget {
            isa,
            vector_bytes,
            ..VectorTarget::default()
        };
        assert_eq!(t(Isa::Avx2, 32).int_lanes(32), 8);
        assert_eq!(t(Isa::Avx512, 64).int_lanes(16), 32);
        assert_eq!(t(Isa::Avx512, 64).int_lanes(64), 8);
        // AVX without AVX2: 32-byte float vectors, 16-byte integer ones.
        assert_eq!(t(Isa::Sse2, 32).int_lanes(32), 4);
        assert_eq!(t(Isa::Neon, 16).int_lanes(64), 2);
        assert_eq!(t(Isa::Generic, 4).int_lanes(16), 1);
    }
}
