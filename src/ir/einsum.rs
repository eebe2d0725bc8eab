//! Einsum-style specs (placeholder; being written).
