//! The generated meshes of `testkit` loaded into a store, for unit tests.

pub use testkit::mesh::Shape;

use super::Store;
use crate::config::parse::parse_file;

/// A generated mesh as the sources would load it.
pub trait Load {
    fn store(&self) -> Store;
}

impl Load for Shape {
    fn store(&self) -> Store {
        let parsed = parse_file("generated.yaml", &self.yaml());
        assert!(
            parsed.errors().next().is_none(),
            "BUG: generated mesh is invalid: {:?}",
            parsed.issues.first()
        );
        parsed.objects.into_iter().collect()
    }
}

/// A mesh of `services` services spread over `namespaces` namespaces (the benchmarks').
pub fn generate(services: usize, namespaces: usize, endpoints: usize) -> Store {
    Shape::new(services, namespaces, endpoints).store()
}
