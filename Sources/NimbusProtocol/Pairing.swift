import NimbusCore

/// Enrolling a device without the server's shell (docs/protocol.md "Devices"): an enrolled device
/// asks for a one-time code (`POST /v1/devices/pairing`), the new machine trades it for its own
/// token (`POST /v1/pair`, no token needed).
public enum PairingLimits {
    /// How long a code can be used.
    public static let lifetimeSeconds: Int64 = 600
    /// Wrong codes per client address per minute before `rate_limited`.
    public static let wrongPerAddressPerMinute = 5
    /// Wrong codes per instance per minute (all addresses together) before `rate_limited`.
    public static let wrongPerMinute = 30
    /// The alphabet of codes: Crockford's base 32 (no I, L, O, U); 12 characters, 60 bits.
    public static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    public static let length = 12

    /// A code as typed back: case, spaces and dashes do not matter, and I/L read as 1, O as 0.
    /// Nil when it cannot be a code.
    public static func normalize(_ typed: String) -> String? {
        var out = ""
        for ch in typed.uppercased() where ch != "-" && ch != " " {
            let c: Character = ch == "I" || ch == "L" ? "1" : ch == "O" ? "0" : ch
            guard alphabet.contains(c) else { return nil }
            out.append(c)
        }
        return out.count == length ? out : nil
    }

    /// `XXXX-XXXX-XXXX`.
    public static func display(_ code: String) -> String {
        stride(from: 0, to: code.count, by: 4).map { i in
            String(code.dropFirst(i).prefix(4))
        }.joined(separator: "-")
    }
}

/// `POST /v1/devices/pairing`: a code for a new device of this account named `device`.
public struct PairingRequest: Hashable, Sendable, Codable {
    public var device: String
    public init(device: String) { self.device = device }
}

public struct PairingCode: Hashable, Sendable, Codable {
    /// As shown to people: `XXXX-XXXX-XXXX`.
    public var code: String
    public var device: String
    /// Seconds since 1970 after which the code no longer works.
    public var expires: Int64
    public init(code: String, device: String, expires: Int64) {
        self.code = code
        self.device = device
        self.expires = expires
    }
}

/// `POST /v1/pair`: the code, and optionally another name for the new device.
public struct PairRequest: Hashable, Sendable, Codable {
    public var code: String
    public var device: String?
    public init(code: String, device: String? = nil) {
        self.code = code
        self.device = device
    }
}

/// The new device's token (shown once; the server keeps only its hash).
public struct PairResult: Hashable, Sendable, Codable {
    public var token: String
    public var account: String
    public var device: String
    public var deviceID: DeviceID
    public init(token: String, account: String, device: String, deviceID: DeviceID) {
        self.token = token
        self.account = account
        self.device = device
        self.deviceID = deviceID
    }
}

/// `GET /v1/devices`: the devices of this account; `POST /v1/devices/{id or name}/revoke`
/// answers one.
public struct DeviceInfo: Hashable, Sendable, Codable {
    public var id: DeviceID
    public var name: String
    /// Seconds since 1970.
    public var created: Int64
    /// Seconds since 1970 when revoked; nil while its token works.
    public var revoked: Int64?
    public init(id: DeviceID, name: String, created: Int64, revoked: Int64?) {
        self.id = id
        self.name = name
        self.created = created
        self.revoked = revoked
    }
}

public struct DeviceList: Hashable, Sendable, Codable {
    public var devices: [DeviceInfo]
    public init(devices: [DeviceInfo]) { self.devices = devices }
}
