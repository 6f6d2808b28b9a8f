//! YAML loaded into a store for tests: any document set that must be valid, and the
//! generated meshes of `testkit`.

pub use testkit::mesh::Shape;

use super::Store;
use crate::config::parse::parse_file;

/// The objects of `yaml` (named `file` in errors) in a store, as the sources would load
/// them; any invalid object fails the caller.
pub fn store_of(file: &str, yaml: &str) -> Store {
    let parsed = parse_file(file, yaml);
    assert!(
        parsed.errors().next().is_none(),
        "{file} is invalid: {:?}",
        parsed.issues
    );
    parsed.objects.into_iter().collect()
}

/// A generated mesh as the sources would load it.
pub trait Load {
    fn store(&self) -> Store;
}

impl Load for Shape {
    fn store(&self) -> Store {
        store_of("generated.yaml", &self.yaml())
    }
}

/// A mesh of `services` services spread over `namespaces` namespaces (the benchmarks').
pub fn generate(services: usize, namespaces: usize, endpoints: usize) -> Store {
    Shape::new(services, namespaces, endpoints).store()
}
