use arrayjit::backend::{CcBackend, Config, MergeBuffer};
use arrayjit::ir::einsum::projections;
use arrayjit::ir::*;
fn main() -> anyhow::Result<()> {
    let x = Tnode::with_init(
        &["x"],
        &[4, 2],
        Prec::Single,
        &InitOp::ConstantFill {
            values: vec![0.5, -1., 2., 3., 1., 1., 0., 2.],
            strict: true,
        },
    )?;
    let w = Tnode::with_init(&["w"], &[2, 3], Prec::Single, &InitOp::RangeOverOffsets)?;
    let y = Tnode::new(&["y"], &[4, 3], Prec::Single)?;
    let z = Tnode::new(&["z"], &[4, 3], Prec::Single)?;
    let s = Tnode::new(&["s"], &[4], Prec::Single)?;
    s.ensure_hosted()?;
    let b = Bindings::empty();
    let a = Assignments::seq([
        Assignments::AccumBinop {
            initialize_neutral: true,
            accum: Binop::Add,
            op: Binop::Mul,
            lhs: y.clone(),
            rhs1: Buffer::Node(x.clone()),
            rhs2: Buffer::Node(w.clone()),
            projections: projections("ij,jk->ik", y.dims(), &[x.dims(), w.dims()], &b)?,
        },
        Assignments::AccumUnop {
            initialize_neutral: false,
            accum: Binop::Arg2,
            op: Unop::Relu,
            lhs: z.clone(),
            rhs: Buffer::Node(y.clone()),
            projections: projections("ij->ij", z.dims(), &[y.dims()], &b)?,
        },
        Assignments::AccumUnop {
            initialize_neutral: true,
            accum: Binop::Add,
            op: Unop::Identity,
            lhs: s.clone(),
            rhs: Buffer::Node(z.clone()),
            projections: projections("ij->i", s.dims(), &[z.dims()], &b)?,
        },
    ]);
    let be = CcBackend::new();
    be.initialize(Config::default());
    let code = be.compile(true, Some("fwd"), &b, &a)?;
    println!("{}", arrayjit::lower::to_doc(&code.optimized().code));
    let ctx = be.init("ctx")?;
    let r = be.link(&[], &MergeBuffer::new(), &ctx, &code)?;
    for t in [&x, &w, &s] {
        be.from_host(r.context(), t)?;
    }
    r.run()?;
    be.to_host(r.context(), &s)?;
    println!("{:?}", s.host_values());
    Ok(())
}
