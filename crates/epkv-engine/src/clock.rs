//! [`EngineClock`]: which time source a bucket reads.

use epkv_executor::{Clock, OffsetClock, SystemClock};
use std::fmt;
use std::sync::Arc;

/// The time source of a bucket. Every expiry, lock-timeout and CAS decision reads it.
#[derive(Clone)]
pub enum EngineClock {
    /// The machine's clocks. ADJUST_TIMEOFDAY answers NotSupported.
    System,
    /// The machine's clocks shifted by an offset that [`epkv_engine_api::Engine::adjust_time`]
    /// sets (the server's `--testing` mode); this is the only mode in which adjusting time
    /// is allowed.
    Testing(Arc<OffsetClock>),
    /// Any other clock, e.g. an `epkv_executor::ManualClock` in tests. ADJUST_TIMEOFDAY
    /// answers NotSupported; the test moves the clock itself.
    Custom(Arc<dyn Clock>),
}

impl EngineClock {
    /// Returns the clock to read.
    #[must_use]
    pub fn clock(&self) -> Arc<dyn Clock> {
        match self {
            Self::System => Arc::new(SystemClock),
            Self::Testing(c) => c.clone(),
            Self::Custom(c) => c.clone(),
        }
    }

    /// Returns the adjustable clock in testing mode.
    #[must_use]
    pub fn testing(&self) -> Option<&Arc<OffsetClock>> {
        match self {
            Self::Testing(c) => Some(c),
            Self::System | Self::Custom(_) => None,
        }
    }
}

impl fmt::Debug for EngineClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::System => f.write_str("System"),
            Self::Testing(c) => f.debug_tuple("Testing").field(c).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}
