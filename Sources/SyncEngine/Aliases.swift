import LocalStore

// LocalStore and NimbusProtocol both name a type `ItemRecord`, and the module `LocalStore` also
// has a class `LocalStore` (so `LocalStore.ItemRecord` does not parse as the module's type).
// This file imports only LocalStore, so the unqualified name is unambiguous here.
typealias LocalItem = ItemRecord
