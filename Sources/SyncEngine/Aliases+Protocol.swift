import NimbusProtocol

// See Aliases.swift: this file imports only NimbusProtocol.
typealias ServerItem = ItemRecord
