//! How to train (the batch, the epochs, the devices, the schedule) and what training reports.

use crate::backend::MergeBufferUse;
use std::time::Duration;

/// How many devices to train on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Devices {
    /// As many as pay off, from a cost model of the work of a step (see the [module
    /// documentation](super#how-many-devices)): one device for a step of a few microseconds,
    /// up to one per core (dividing the batch) for a larger one. On the MPI backend, one
    /// device per rank.
    #[default]
    Auto,
    /// This many virtual devices (over all ranks on the MPI backend: a multiple of the
    /// number of ranks), spread evenly over the backend's physical devices
    /// ([`Backend::placement`](crate::backend::Backend::placement)).
    Count(usize),
}

/// How the steps run (see the [module documentation](super#schedules)).
///
/// The fast schedules (`Auto`, `Exchange`, `Tree`, `HostTree`) give the same results bit for
/// bit for a given number of devices, but the sums of the gradients associate differently
/// for different numbers of devices, so results on 2 and 3 devices differ in the last bits.
/// [`Schedule::Deterministic`] gives the same bits on any number of devices, at a cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Schedule {
    /// The exchange where the devices allow it, else the tree, both as one program per
    /// device queue; the host-scheduled tree over several ranks.
    #[default]
    Auto,
    /// The hierarchical exchange (a tree per queue, recursive doubling between the queues),
    /// one program per device queue; an error where the devices do not allow it.
    Exchange,
    /// The tree into device 0, one program per device queue (on one rank; the host-scheduled
    /// tree over several).
    Tree,
    /// The tree into device 0, scheduled by the host step by step.
    HostTree,
    /// The batch split into `shards` slices whatever the number of devices, each slice's
    /// gradient computed by the same routine, and the slices' gradients summed in slice
    /// order on every device: the same bits on any number of devices (up to `shards`).
    Deterministic {
        /// Slices per batch (dividing the batch; at least the number of devices).
        shards: usize,
    },
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Auto => write!(f, "auto"),
            Schedule::Exchange => write!(f, "exchange"),
            Schedule::Tree => write!(f, "tree"),
            Schedule::HostTree => write!(f, "host-tree"),
            Schedule::Deterministic { shards } => write!(f, "deterministic ({shards} shards)"),
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = crate::error::Error;

    /// Reads a schedule as command lines spell it: `auto`, `exchange`, `tree`, `host-tree` or
    /// `deterministic:S` (`S` shards).
    ///
    /// ```
    /// use arrayjit::parallel::Schedule;
    /// assert_eq!("host-tree".parse::<Schedule>().unwrap(), Schedule::HostTree);
    /// assert_eq!(
    ///     "deterministic:4".parse::<Schedule>().unwrap(),
    ///     Schedule::Deterministic { shards: 4 }
    /// );
    /// assert!("fast".parse::<Schedule>().is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`](crate::Error::Invalid) naming the text, for any other text (a
    /// number of shards that is not a number included).
    fn from_str(s: &str) -> std::result::Result<Schedule, Self::Err> {
        match s {
            "auto" => Ok(Schedule::Auto),
            "exchange" => Ok(Schedule::Exchange),
            "tree" => Ok(Schedule::Tree),
            "host-tree" => Ok(Schedule::HostTree),
            other => match other.strip_prefix("deterministic:").map(str::parse) {
                Some(Ok(shards)) => Ok(Schedule::Deterministic { shards }),
                _ => Err(crate::error::Error::Invalid {
                    what: "a schedule".into(),
                    value: format!("{other:?}"),
                    expected: "auto, exchange, tree, host-tree or deterministic:SHARDS".into(),
                }),
            },
        }
    }
}

/// How to train: the batch, the epochs, the devices, the schedule. Build it with
/// [`Settings::new`] and the methods below; the fields say what each one sets.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Settings {
    /// Samples per step (split evenly into the slices of the devices or shards).
    pub batch: usize,
    /// Passes over the data.
    pub epochs: usize,
    /// How many devices ([`Devices::Auto`] by default).
    pub devices: Devices,
    /// How the steps run ([`Schedule::Auto`] by default).
    pub schedule: Schedule,
    /// How gradients reach the device adding them up: [`MergeBufferUse::Streaming`] (the
    /// default: it reads the source's buffer in place) or [`MergeBufferUse::Copy`].
    pub merge: MergeBufferUse,
    /// The seed of the order of the batches, shuffled per epoch; `None` (the default): in
    /// order.
    pub shuffle: Option<u64>,
    /// Whether [`Devices::Auto`] leaves out the cores other processes keep busy when it
    /// starts (`true`, the default; see the [module documentation](super#how-many-devices)).
    /// `false` makes its choice depend on the step and the backend only.
    pub watch_load: bool,
}

impl Settings {
    /// `epochs` passes over the data in batches of `batch` samples, with the defaults for
    /// the rest.
    pub fn new(batch: usize, epochs: usize) -> Settings {
        Settings {
            batch,
            epochs,
            devices: Devices::Auto,
            schedule: Schedule::Auto,
            merge: MergeBufferUse::Streaming,
            shuffle: None,
            watch_load: true,
        }
    }

    /// Sets [`batch`](Settings::batch).
    pub fn batch(mut self, batch: usize) -> Settings {
        self.batch = batch;
        self
    }

    /// Sets [`epochs`](Settings::epochs).
    pub fn epochs(mut self, epochs: usize) -> Settings {
        self.epochs = epochs;
        self
    }

    /// Sets [`devices`](Settings::devices).
    pub fn devices(mut self, devices: Devices) -> Settings {
        self.devices = devices;
        self
    }

    /// Sets [`schedule`](Settings::schedule).
    pub fn schedule(mut self, schedule: Schedule) -> Settings {
        self.schedule = schedule;
        self
    }

    /// Sets [`merge`](Settings::merge).
    pub fn merge(mut self, merge: MergeBufferUse) -> Settings {
        self.merge = merge;
        self
    }

    /// Sets [`shuffle`](Settings::shuffle).
    pub fn shuffle(mut self, seed: Option<u64>) -> Settings {
        self.shuffle = seed;
        self
    }

    /// Sets [`watch_load`](Settings::watch_load).
    pub fn watch_load(mut self, watch: bool) -> Settings {
        self.watch_load = watch;
        self
    }
}

/// The end of an epoch, as reported to the callback of [`train`](super::train).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Epoch {
    /// The epoch, from 1.
    pub epoch: usize,
    /// Epochs in the training.
    pub epochs: usize,
    /// The mean over the epoch's steps of the batch loss.
    pub loss: f64,
    /// Steps done so far (over all epochs).
    pub steps: usize,
    /// Time since the first step was scheduled (when the host learned of the epoch's end; the
    /// host checks every 100 ms while programs run).
    pub elapsed: Duration,
}

/// Where the host's time went during training. The host only schedules work (the devices
/// order it among themselves) and waits for the loss history of each epoch, so most of the
/// training time is normally `waiting`: the devices' work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct PhaseTimes {
    /// Scheduling the training steps (gradients, merges, updates, parameter copies).
    pub scheduling: Duration,
    /// Blocked waiting for devices (the loss history of each epoch, the end of the work).
    pub waiting: Duration,
    /// Reading the loss history back at the end of each epoch (including the wait for it).
    pub loss_readback: Duration,
}

/// The outcome of [`train`](super::train).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The backend's name.
    pub backend: String,
    /// Virtual devices used (over all ranks).
    pub devices: usize,
    /// Processes the devices were spread over ([`Backend::num_ranks`]: 1 but for the MPI
    /// backend, where each rank holds `devices / ranks` of them).
    ///
    /// [`Backend::num_ranks`]: crate::backend::Backend::num_ranks
    pub ranks: usize,
    /// How the steps ran: [`Schedule::Exchange`], [`Schedule::Tree`],
    /// [`Schedule::HostTree`] or [`Schedule::Deterministic`] (never `Auto`).
    pub schedule: Schedule,
    /// The mean batch loss of each epoch.
    pub epoch_losses: Vec<f64>,
    /// The trained parameters' values, one vector per parameter in the order given to
    /// [`Model::param`](super::Model::param), row-major.
    pub params: Vec<Vec<f64>>,
    /// Training steps run.
    pub steps: usize,
    /// Samples trained on (`steps · batch`).
    pub samples: usize,
    /// The cost model's count of the work of one step's gradient code on the whole batch,
    /// in cell operations (see the [module documentation](super#how-many-devices)).
    pub step_work: u64,
    /// Routines compiled (in one `compile_batch`).
    pub routines: usize,
    /// Lowering, optimizing, generating C, running the C compiler and loading the library.
    pub compile_time: Duration,
    /// Creating devices, linking, and the initial copies to the devices.
    pub setup_time: Duration,
    /// The training steps (from the first step to the last epoch's loss).
    pub train_time: Duration,
    /// The evaluation ([`Model::evaluate`](super::Model::evaluate)) and reading the
    /// parameters back.
    pub eval_time: Duration,
    /// Where the training time went.
    pub phases: PhaseTimes,
    /// Chunks of parallel regions that a device's thread ran for a device on another core
    /// it was waiting for (the exchange and the tree as programs: a device whose core
    /// another process shares gets help with its gradients; see the [module
    /// documentation](super#schedules)). 0 for the host-scheduled tree and the
    /// deterministic schedule.
    pub lent_chunks: u64,
}

impl Report {
    /// Training throughput: samples per second of [`train_time`](Report::train_time).
    pub fn samples_per_sec(&self) -> f64 {
        let s = self.train_time.as_secs_f64();
        if s > 0.0 {
            self.samples as f64 / s
        } else {
            0.0
        }
    }

    /// The trained parameters laid one after another (the order of
    /// [`params`](Report::params)).
    pub fn flat_params(&self) -> Vec<f64> {
        self.params.concat()
    }
}

#[cfg(test)]
mod tests {
    use super::Schedule;
    use crate::error::Error;

    #[test]
    fn schedules_read_back_as_command_lines_spell_them() {
        for (text, s) in [
            ("auto", Schedule::Auto),
            ("exchange", Schedule::Exchange),
            ("tree", Schedule::Tree),
            ("host-tree", Schedule::HostTree),
            ("deterministic:12", Schedule::Deterministic { shards: 12 }),
        ] {
            assert_eq!(text.parse::<Schedule>().unwrap(), s);
        }
        for bad in [
            "",
            "Tree",
            "deterministic:",
            "deterministic:x",
            "deterministic:-1",
        ] {
            match bad.parse::<Schedule>() {
                Err(Error::Invalid { value, .. }) => assert_eq!(value, format!("{bad:?}")),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
