//! Where an endpoint or proxy runs: region, zone and subzone.

use super::*;

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

impl Locality {
    /// `region/zone/subzone`, as WorkloadEntry and the locality label write it.
    pub fn parse(text: &str) -> Locality {
        let mut parts = text.split('/').map(str::to_string);
        Locality {
            region: parts.next().unwrap_or_default(),
            zone: parts.next().unwrap_or_default(),
            subzone: parts.next().unwrap_or_default(),
        }
    }
}
