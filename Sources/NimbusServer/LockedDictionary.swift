import Synchronization

/// A string-keyed cache shared between request handlers. One `Mutex`; never held across `await`.
final class LockedDictionary<Value: Sendable>: Sendable {
    private let storage = Mutex<[String: Value]>([:])

    subscript(key: String) -> Value? {
        get { storage.withLock { $0[key] } }
        set { storage.withLock { $0[key] = newValue } }
    }
}
