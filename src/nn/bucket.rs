//! Fusion buffers: several tensors packed one after another into one flat tensor, so that a
//! merge, a copy between devices or an all-reduce moves one buffer instead of one per tensor
//! (what Horovod calls tensor fusion and PyTorch's data-parallel training calls gradient
//! buckets). Each transfer and each merge routine has a fixed cost (scheduling, locking the
//! buffers, a cross-device handoff); for a small model that cost, not the data, is most of a
//! data-parallel step.

use crate::error::{Error, Result};
use crate::ir::{
    Assignments, AxisIndex, Binop, Buffer, MemoryMode, Prec, Projections, Tnode, Unop,
};

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
    /// [`Error::Usage`] when `parts` is empty, mixes precisions, or holds a tensor of more than
    /// four axes (a linear index has at most four terms).
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
            None => return Err(Error::Usage(format!("bucket {label:?}: no tensors"))),
        };
        let mut offset = 0;
        let mut placed = vec![];
        for t in parts {
            if t.prec() != prec {
                return Err(Error::Usage(format!(
                    "bucket {label:?}: {} is {:?}, the bucket is {prec:?}",
                    t.name(),
                    t.prec()
                )));
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
        let flat = AxisIndex::linear(&terms, offset).ok_or_else(|| {
            Error::Usage(format!(
                "bucket {}: {} has more than four axes",
                self.flat.name(),
                t.name()
            ))
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

    /// Copies the flat tensor back into every part.
    ///
    /// # Errors
    ///
    /// None in practice: the projections were checked when the bucket was made.
    pub fn unpack(&self) -> Result<Assignments> {
        let mut code = vec![];
        for (t, off) in &self.parts {
            let (mut p, flat) = self.projections(t, *off)?;
            p.rhs_dims = vec![self.flat.dims().to_vec()];
            p.project_rhs = vec![vec![flat]];
            p.debug_info = format!("unpack {} from {}", t.name(), self.flat.name());
            code.push(copy(t, &self.flat, p));
        }
        Ok(Assignments::block(
            &format!("unpack {}", self.flat.name()),
            Assignments::seq(code),
        ))
    }
}

/// `lhs[..] = rhs[..]` under `p`.
fn copy(lhs: &Tnode, rhs: &Tnode, p: Projections) -> Assignments {
    Assignments::AccumUnop {
        initialize_neutral: false,
        accum: Binop::Arg2,
        op: Unop::Identity,
        lhs: lhs.clone(),
        rhs: Buffer::Node(rhs.clone()),
        projections: p,
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
    fn bad_buckets_are_rejected() {
        let a = Tnode::new(&["a"], &[2], Prec::Single).unwrap();
        let d = Tnode::new(&["d"], &[2], Prec::Double).unwrap();
        let e = Bucket::on_device(&["mixed"], &[a, d]).unwrap_err();
        assert!(e.to_string().contains("d is"), "{e}");
        let e = Bucket::on_device(&["none"], &[]).unwrap_err();
        assert!(e.to_string().contains("no tensors"), "{e}");
        let five = Tnode::new(&["five"], &[2, 2, 2, 2, 2], Prec::Single).unwrap();
        let e = Bucket::on_device(&["deep"], &[five]).unwrap_err();
        assert!(e.to_string().contains("more than four axes"), "{e}");
    }
}
