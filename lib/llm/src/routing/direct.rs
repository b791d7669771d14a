//! One given instance, whatever the candidates (a caller that picked the worker itself).

use super::{Pick, SelectError, Selector};

/// Always picks its instance.
#[derive(Debug, Clone, Copy)]
pub struct Direct {
    instance: u64,
}

impl Direct {
    /// Every request goes to `instance`.
    pub fn new(instance: u64) -> Self {
        Direct { instance }
    }

    /// The instance it sends to.
    pub fn instance(&self) -> u64 {
        self.instance
    }
}

impl Selector for Direct {
    fn select(&self, _tokens: &[u32], _candidates: &[u64]) -> Result<Pick, SelectError> {
        Ok(Pick::of(self.instance))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_its_instance() {
        assert_eq!(Direct::new(5).select(&[], &[1, 2]).unwrap().instance, 5);
        assert_eq!(Direct::new(5).select(&[], &[]).unwrap().instance, 5);
    }
}
