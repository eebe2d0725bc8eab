//! Fusion buffers: several tensors packed one after another into one flat tensor, so that a
//! merge, a copy between devices or an all-reduce moves one buffer instead of one per tensor
//! (what Horovod calls tensor fusion and PyTorch's data-parallel training calls gradient
//! buckets). Each transfer and each merge routine has a fixed cost (scheduling, locking the
//! buffers, a cross-device handoff); for a small model that cost, not the data, is most of a
//! data-parallel step.

use super::copy;
use crate::error::{Error, Result};
use crate::ir::{Assignments, AxisIndex, MemoryMode, Prec, Projections, StaticSymbol, Tnode};

/// A flat tensor holding `parts`, each at its offset, row-major, in the order given.
#[derive(Clone, Debug)]
pub struct Bucket {
    flat: Tnode,
    parts: Vec<(Tnode, usize)>,
}

impl Bucket {
    /// A bucket labelled `label` for `parts` (all of one precision) whose flat tensor lives on
    /// devices only (`OnDevice`): what moves between devices.
    ///
    /// # Errors
    ///
    /// [`Error::Missing`] when `parts` is empty, [`Error::MixedPrecision`] when it mixes
    /// precisions, [`Error::Dims`] when it holds a tensor of more than four axes (a linear
    /// index has at most four terms).
    pub fn on_device(label: &[&str], parts: &[Tnode]) -> Result<Bucket> {
        Bucket::new(label, parts, false)
    }

    /// Like [`on_device`](Bucket::on_device), with a host array for the flat tensor (zeros
    /// until copied from a device), so that it can be copied to and from the host.
    ///
    /// # Errors
    ///
    /// As for [`on_device`](Bucket::on_device).
    pub fn hosted(label: &[&str], parts: &[Tnode]) -> Result<Bucket> {
        Bucket::new(label, parts, true)
    }

    fn new(label: &[&str], parts: &[Tnode], hosted: bool) -> Result<Bucket> {
        let prec: Prec = match parts.first() {
            Some(t) => t.prec(),
            None => {
                return Err(Error::Missing {
                    what: format!("tensors for bucket {}", label.join(".")),
                    hint: "a bucket packs at least one tensor".into(),
                })
            }
        };
        let mut offset = 0;
        let mut placed = vec![];
        for t in parts {
            if t.prec() != prec {
                return Err(Error::MixedPrecision {
                    what: format!("the parts of bucket {}", label.join(".")),
                    tensor: t.name(),
                    prec: t.prec().to_string(),
                    expected: prec.to_string(),
                });
            }
            placed.push((t.clone(), offset));
            offset += t.dims().iter().product::<usize>();
        }
        let builder = Tnode::builder(label, &[offset], prec);
        let flat = if hosted {
            builder.hosted().build()?
        } else {
            builder.memory(MemoryMode::OnDevice).build()?
        };
        let b = Bucket {
            flat,
            parts: placed,
        };
        // Build the projections once to reject tensors they cannot express.
        for (t, off) in &b.parts {
            b.projections(t, *off)?;
        }
        Ok(b)
    }

    /// The flat tensor.
    pub fn flat(&self) -> &Tnode {
        &self.flat
    }

    /// The tensors and their offsets in the flat tensor.
    pub fn parts(&self) -> &[(Tnode, usize)] {
        &self.parts
    }

    /// `t`'s cells and, for each, its index in the flat tensor (`offset + row-major position`):
    /// pointwise projections over `t`'s dims, and the flat index.
    fn projections(&self, t: &Tnode, offset: usize) -> Result<(Projections, AxisIndex)> {
        let p = Projections::pointwise(t.dims(), 1);
        let mut terms = vec![];
        let mut stride = 1;
        for (ix, d) in p.project_lhs.iter().zip(t.dims()).rev() {
            if let AxisIndex::Iterator(s) = ix {
                terms.push((*s, stride));
            }
            stride *= d;
        }
        let flat = AxisIndex::linear(&terms, offset).ok_or_else(|| Error::Dims {
            tensor: t.name(),
            dims: t.dims().to_vec(),
            problem: format!(
                "have more than four axes, too many for a part of bucket {} (its linear index                  has at most four terms)",
                self.flat.name()
            ),
        })?;
        Ok((p, flat))
    }

    /// Copies every part into the flat tensor.
    ///
    /// # Errors
    ///
    /// None in practice: the projections were checked when the bucket was made.
    pub fn pack(&self) -> Result<Assignments> {
        let mut code = vec![];
        for (t, off) in &self.parts {
            let (mut p, flat) = self.projections(t, *off)?;
            p.lhs_dims = self.flat.dims().to_vec();
            p.project_lhs = vec![flat];
            p.debug_info = format!("pack {} into {}", t.name(), self.flat.name());
            code.push(copy(&self.flat, t, p));
        }
        Ok(Assignments::block(
            &format!("pack {}", self.flat.name()),
            Assignments::seq(code),
        ))
    }

    /// Copies every part into row `row` of `rows`, a `[k, n]` tensor whose rows are the
    /// size `n` of the flat tensor (rows alternating between steps let a device write the
    /// next step's values while another still reads this step's).
    ///
    /// # Errors
    ///
    /// [`Error::Dims`] when `rows` is not `[k, n]`, [`Error::Invalid`] when `row`'s range
    /// exceeds `k`.
    pub fn pack_into_row(&self, rows: &Tnode, row: &StaticSymbol) -> Result<Assignments> {
        let n = self.flat.dims()[0];
        let k = match rows.dims() {
            [k, m] if *m == n => *k,
            other => {
                return Err(Error::Dims {
                    tensor: rows.name(),
                    dims: other.to_vec(),
                    problem: format!(
                        "do not fit packing bucket {} into a row, which needs [k, {n}]",
                        self.flat.name()
                    ),
                })
            }
        };
        if row.range.is_none_or(|r| r > k) {
            return Err(Error::Invalid {
                what: format!("the range of row index {}", row.name),
                value: row
                    .range
                    .map_or_else(|| "unbounded".to_string(), |r| r.to_string()),
                expected: format!(
                    "at most {k} (the rows of {}, packing bucket {})",
                    rows.name(),
                    self.flat.name()
                ),
            });
        }
        let mut code = vec![];
        for (t, off) in &self.parts {
            let (mut p, flat) = self.projections(t, *off)?;
            p.lhs_dims = rows.dims().to_vec();
            p.project_lhs = vec![AxisIndex::Iterator(row.symbol), flat];
            p.debug_info = format!("pack {} into a row of {}", t.name(), rows.name());
            code.push(copy(rows, t, p));
        }
        Ok(Assignments::block(
            &format!("pack {} into a row of {}", self.flat.name(), rows.name()),
            Assignments::seq(code),
        ))
    }

    /// Copies the flat tensor back into every part.
    ///
    /// # Errors
    ///
    /// None in practice: the projections were checked when the bucket was made.
    pub fn unpack(&self) -> Result<Assignments> {
        let parts: Vec<Tnode> = self.parts.iter().map(|(t, _)| t.clone()).collect();
        self.unpack_from(&self.flat, &parts)
    }

    /// Copies `from`, a tensor laid out like the flat tensor (same dims), into `into`, one
    /// tensor per part with the part's dims: e.g. merged gradients into tensors of the
    /// update's own, so that the routine computing the gradients and the one applying them
    /// share only the flat tensor.
    ///
    /// # Errors
    ///
    /// [`Error::Dims`] when `from`'s dims differ from the flat tensor's or a tensor of `into`
    /// has other dims than its part, [`Error::Count`] when `into` does not have one tensor
    /// per part.
    pub fn unpack_from(&self, from: &Tnode, into: &[Tnode]) -> Result<Assignments> {
        if from.dims() != self.flat.dims() {
            return Err(Error::Dims {
                tensor: from.name(),
                dims: from.dims().to_vec(),
                problem: format!(
                    "differ from the dims {:?} of bucket {}, so it cannot be unpacked like it",
                    self.flat.dims(),
                    self.flat.name()
                ),
            });
        }
        if into.len() != self.parts.len() {
            return Err(Error::Count {
                what: format!(
                    "tensors to unpack {} into (one per part of bucket {})",
                    from.name(),
                    self.flat.name()
                ),
                expected: self.parts.len(),
                got: into.len(),
            });
        }
        let mut code = vec![];
        for ((t, off), dst) in self.parts.iter().zip(into) {
            if dst.dims() != t.dims() {
                return Err(Error::Dims {
                    tensor: dst.name(),
                    dims: dst.dims().to_vec(),
                    problem: format!(
                        "differ from the dims {:?} of part {} of bucket {}, which it receives",
                        t.dims(),
                        t.name(),
                        self.flat.name()
                    ),
                });
            }
            let (mut p, flat) = self.projections(t, *off)?;
            p.rhs_dims = vec![from.dims().to_vec()];
            p.project_rhs = vec![vec![flat]];
            p.debug_info = format!("unpack {} from {}", dst.name(), from.name());
            code.push(copy(dst, from, p));
        }
        Ok(Assignments::block(
            &format!("unpack {}", from.name()),
            Assignments::seq(code),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{run_assignments, Memory};

    #[test]
    fn pack_places_each_part_at_its_offset_and_unpack_restores_it() {
        let a = Tnode::new(&["a"], &[2, 3], Prec::Single).unwrap();
        let b = Tnode::new(&["b"], &[4], Prec::Single).unwrap();
        let s = Tnode::new(&["s"], &[1], Prec::Single).unwrap();
        let bucket = Bucket::hosted(&["fused"], &[a.clone(), b.clone(), s.clone()]).unwrap();
        assert_eq!(bucket.flat().dims(), &[11]);
        let offsets: Vec<usize> = bucket.parts().iter().map(|(_, o)| *o).collect();
        assert_eq!(offsets, vec![0, 6, 10]);

        let mut mem = Memory::new();
        mem.set(&a, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        mem.set(&b, vec![7.0, 8.0, 9.0, 10.0]).unwrap();
        mem.set(&s, vec![11.0]).unwrap();
        mem.set(bucket.flat(), vec![0.0; 11]).unwrap();
        run_assignments(&bucket.pack().unwrap(), &[], &mut mem).unwrap();
        let expected: Vec<f64> = (1..=11).map(f64::from).collect();
        assert_eq!(mem.get(bucket.flat()).unwrap(), expected.as_slice());

        // Unpacking other flat values overwrites every part with its range.
        let other: Vec<f64> = (1..=11).map(|v| f64::from(v) * 10.0).collect();
        mem.set(bucket.flat(), other).unwrap();
        run_assignments(&bucket.unpack().unwrap(), &[], &mut mem).unwrap();
        assert_eq!(mem.get(&a).unwrap(), &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
        assert_eq!(mem.get(&b).unwrap(), &[70.0, 80.0, 90.0, 100.0]);
        assert_eq!(mem.get(&s).unwrap(), &[110.0]);
    }

    #[test]
    fn pack_into_row_fills_only_the_row_of_the_static_index() {
        let a = Tnode::new(&["a"], &[2], Prec::Single).unwrap();
        let b = Tnode::new(&["b"], &[1], Prec::Single).unwrap();
        let bucket = Bucket::on_device(&["fused"], &[a.clone(), b.clone()]).unwrap();
        let rows = Tnode::new(&["rows"], &[2, 3], Prec::Single).unwrap();
        let row = StaticSymbol::new("row", Some(2));
        let code = bucket.pack_into_row(&rows, &row).unwrap();
        let mut mem = Memory::new();
        mem.set(&a, vec![1.0, 2.0]).unwrap();
        mem.set(&b, vec![3.0]).unwrap();
        mem.set(&rows, vec![-1.0; 6]).unwrap();
        run_assignments(&code, &[(row.clone(), 1)], &mut mem).unwrap();
        assert_eq!(mem.get(&rows).unwrap(), &[-1.0, -1.0, -1.0, 1.0, 2.0, 3.0]);
        run_assignments(&code, &[(row.clone(), 0)], &mut mem).unwrap();
        assert_eq!(mem.get(&rows).unwrap(), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);

        let wide = Tnode::new(&["wide"], &[2, 4], Prec::Single).unwrap();
        let e = bucket.pack_into_row(&wide, &row).unwrap_err();
        assert!(matches!(e, Error::Dims { .. }), "{e}");
        assert!(e.to_string().contains("needs [k, 3]"), "{e}");
        let e = bucket
            .pack_into_row(&rows, &StaticSymbol::new("r3", Some(3)))
            .unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        assert!(e.to_string().contains("at most 2"), "{e}");
    }

    #[test]
    fn unpack_from_copies_another_flat_tensor_into_other_tensors() {
        let a = Tnode::new(&["a"], &[2], Prec::Single).unwrap();
        let b = Tnode::new(&["b"], &[1], Prec::Single).unwrap();
        let bucket = Bucket::on_device(&["fused"], &[a.clone(), b.clone()]).unwrap();
        let sum = Tnode::new(&["sum"], &[3], Prec::Single).unwrap();
        let (a2, b2) = (
            Tnode::new(&["a2"], &[2], Prec::Single).unwrap(),
            Tnode::new(&["b2"], &[1], Prec::Single).unwrap(),
        );
        let code = bucket.unpack_from(&sum, &[a2.clone(), b2.clone()]).unwrap();
        let mut mem = Memory::new();
        mem.set(&sum, vec![4.0, 5.0, 6.0]).unwrap();
        mem.set(&a2, vec![0.0; 2]).unwrap();
        mem.set(&b2, vec![0.0]).unwrap();
        run_assignments(&code, &[], &mut mem).unwrap();
        assert_eq!(mem.get(&a2).unwrap(), &[4.0, 5.0]);
        assert_eq!(mem.get(&b2).unwrap(), &[6.0]);

        let e = bucket
            .unpack_from(&sum, &[b2.clone(), a2.clone()])
            .unwrap_err();
        assert!(matches!(e, Error::Dims { .. }), "{e}");
        assert!(e.to_string().contains("of part a of bucket"), "{e}");
        let e = bucket
            .unpack_from(&a2, &[a2.clone(), b2.clone()])
            .unwrap_err();
        assert!(
            matches!(&e, Error::Dims { tensor, .. } if tensor == "a2"),
            "{e}"
        );
    }

    #[test]
    fn bad_buckets_are_rejected() {
        let a = Tnode::new(&["a"], &[2], Prec::Single).unwrap();
        let d = Tnode::new(&["d"], &[2], Prec::Double).unwrap();
        let e = Bucket::on_device(&["mixed"], &[a, d]).unwrap_err();
        assert!(
            matches!(&e, Error::MixedPrecision { tensor, .. } if tensor == "d"),
            "{e}"
        );
        let e = Bucket::on_device(&["none"], &[]).unwrap_err();
        assert!(matches!(e, Error::Missing { .. }), "{e}");
        let five = Tnode::new(&["five"], &[2, 2, 2, 2, 2], Prec::Single).unwrap();
        let e = Bucket::on_device(&["deep"], &[five]).unwrap_err();
        assert!(matches!(e, Error::Dims { .. }), "{e}");
        assert!(e.to_string().contains("more than four axes"), "{e}");
    }
}
