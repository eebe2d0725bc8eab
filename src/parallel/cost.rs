//! The cost model behind [`Devices::Auto`](super::Devices::Auto): how much work a step's
//! gradient code does, and how many devices make a step fastest.

use crate::ir::Assignments;

/// Nanoseconds per cell operation (a loop iteration of a product space) of vectorized code
/// on one core. Measured with the default moons job on a 2-core Intel Sapphire Rapids VM
/// (AVX-512, 7 December 2026, `--devices 1`, 3 interleaved rounds): a step of 120 samples
/// (122,000 cell operations) took 4.56 µs and one of 60 samples 2.3 µs, 0.037 ns per
/// operation. (On the 2-core AMD EPYC VM of earlier measurements, AVX2: 6.0 and 3.4 µs,
/// 0.043 ns. The big moons job's step, 410 million operations, runs its products in packed
/// GEMM kernels, faster per operation; the model only has to rank device counts.)
pub(crate) const CELL_NS: f64 = 0.037;

/// Nanoseconds a step costs a device whatever it computes: its routine runs (entering the
/// generated code, locking its buffers), the intercept of the measurements above (0.05 µs
/// on Sapphire Rapids, 0.7 µs on the AMD VM).
pub(crate) const RUN_NS: f64 = 100.0;

/// Nanoseconds each level of the sum of the gradients over devices costs: a transfer, a
/// merge routine and the wait for the device merged from, the lockstep between devices
/// included. Measured as above: two devices of 60 samples each took 3.2 µs a step, where
/// one device of 60 took 2.3 µs, so the level cost 0.9 µs. (On the AMD VM it cost 2.7 µs:
/// 6.1 against 3.4 µs. With that machine's figures the default moons job stays on one
/// device; with these it takes two, which ran 1.40× one device on the quiet Sapphire Rapids
/// VM.) A step must save more than this to be split.
pub(crate) const LEVEL_NS: f64 = 900.0;

/// The work of `code` in cell operations: for every statement, the number of points of its
/// product space (the loop iterations it runs; a fetch or a gather counts the cells it
/// writes). Loop nests the optimizer fuses or kernels it packs still count their points.
pub(crate) fn work(code: &Assignments) -> u64 {
    let mut total = 0u64;
    code.visit(&mut |a| {
        let n: usize = match a {
            Assignments::AccumBinop { projections, .. }
            | Assignments::AccumTernop { projections, .. }
            | Assignments::AccumUnop { projections, .. } => {
                projections.product_space.iter().product()
            }
            Assignments::Gather { lhs, .. } => lhs.numel(),
            Assignments::ScatterAdd { src, .. } => src.numel(),
            Assignments::Fetch { array, .. } => array.numel(),
            _ => 0,
        };
        total = total.saturating_add(n as u64);
    });
    total
}

/// The estimated time in nanoseconds of a step whose gradient code does `work` cell
/// operations on the whole batch, split into `parts` slices on `devices` devices over
/// `queues` queues (cores): each queue runs its block of `⌈devices / queues⌉` devices one
/// after another, each device its `⌈parts / devices⌉` slices (a routine run each), then the
/// sums over devices take `⌈log2 devices⌉` levels.
pub(crate) fn step_ns(work: u64, parts: usize, devices: usize, queues: usize) -> f64 {
    let (parts, devices, queues) = (parts.max(1), devices.max(1), queues.max(1));
    let per_queue = devices.div_ceil(queues);
    let per_device = parts.div_ceil(devices);
    let slice = work as f64 * CELL_NS / parts as f64 + RUN_NS;
    let levels = usize::BITS - (devices - 1).leading_zeros();
    (per_queue * per_device) as f64 * slice + f64::from(levels) * LEVEL_NS
}

/// The number of devices among `candidates` (ascending) whose step [`step_ns`] estimates
/// fastest; a larger count must beat the best smaller one by 5 % (splitting has costs the
/// model does not see: cores shared with other processes, caches). `parts` is the number
/// of slices of a batch (`None`: one per device).
pub(crate) fn best_devices(
    work: u64,
    parts: Option<usize>,
    queues: usize,
    candidates: &[usize],
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for &n in candidates {
        let t = step_ns(work, parts.unwrap_or(n), n, queues);
        match best {
            Some((_, b)) if t >= 0.95 * b => {}
            _ => best = Some((n, t)),
        }
    }
    best.map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_step_stays_on_one_device_and_a_large_one_spreads() {
        let all = [1, 2, 3, 4, 6, 8];
        // 20,000 cell operations: 0.84 µs on one core; a second core would save 0.37 µs and
        // cost a level of merges of 0.9 µs.
        assert_eq!(best_devices(20_000, None, 2, &all), Some(1));
        // The default moons job: 122,000 operations, 4.6 µs on one core; two would take
        // 2.4 µs and a 0.9 µs level of merges: two devices.
        assert_eq!(best_devices(122_000, None, 2, &all), Some(2));
        // The same on one free core (the other busy): one device.
        assert_eq!(best_devices(122_000, None, 1, &all), Some(1));
        // On 8 cores, 4 devices: a third level of merges would cost more than 8 devices save
        // (150,000 operations: 3.3 µs on 4 devices, 3.5 µs on 8).
        let eight = [1, 2, 3, 4, 5, 6, 8];
        assert_eq!(best_devices(150_000, None, 8, &eight), Some(4));
        // A big step on 2 cores: 2 devices; more devices than cores only add merges.
        assert_eq!(best_devices(400_000_000, None, 2, &all), Some(2));
        // On 8 cores, 8 devices.
        assert_eq!(best_devices(400_000_000, None, 8, &all), Some(8));
        // One queue (the sync backend): one device.
        assert_eq!(best_devices(400_000_000, None, 1, &all), Some(1));
        // Shards: 8 shards on 3 devices run 3 slices a device, as slow as on 4.
        assert!(step_ns(1_000_000, 8, 3, 8) >= step_ns(1_000_000, 8, 4, 8));
        assert_eq!(best_devices(5, None, 2, &[]), None);
    }

    #[test]
    fn work_counts_the_points_of_every_product_space() {
        use crate::ir::{Bindings, Prec, Tnode};
        let t = |n: &str, d: &[usize]| Tnode::new(&[n], d, Prec::Single).unwrap();
        let (x, w, y, s) = (
            t("x", &[4, 3]),
            t("w", &[3, 5]),
            t("y", &[4, 5]),
            t("s", &[4]),
        );
        let none = Bindings::empty();
        let code = Assignments::seq([
            crate::nn::matmul(&y, &x, &w, "bi,io->bo", &none).unwrap(),
            crate::nn::sum(&s, &y, "bo->b", &none).unwrap(),
        ]);
        assert_eq!(work(&code), 4 * 3 * 5 + 4 * 5);
    }
}
