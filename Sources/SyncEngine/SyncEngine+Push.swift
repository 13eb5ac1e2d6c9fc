import Chunking
import Crypto
import Foundation
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import SyncCore

// Push: the ChangeObserver port and the upload loop. Items are pushed in the order of their
// first queued change, so a folder's create is committed before its children's; the commits of
// the items next in the queue go together in one request when several are ready (`CommitBatch`).

extension SyncEngine: ChangeObserver {
    /// Called after the change is in memory and its queue entry (`LocalChange.queued`) is in
    /// the store's queue behind it: remember it in memory, wake the push loop.
    public func localChange(_ change: LocalChange) {
        let (id, kind) = change.queued
        if Mutation.queueEntryAtNotice.isOn { store.enqueue(.syncOp(id, kind: kind)) }
        trace("local \(id) \(kind)")
        let now = options.clock.now
        let rules = pacingRules
        let what: LocalChangeKind = switch change {
        case .writing: .writing
        case .contentChanged: .content
        case .deleted: .deleted
        case .created, .moved, .attributesChanged: .other
        }
        let (queued, whole) = state.withLock { s in
            var record = s.items[id] ?? SyncItem()
            let out = record.noticed(what, at: now, rules: rules)
            s.items[id] = record
            if out.queue { s.push.queue.append(id) }
            // Paused, or the token refused: the push loop would wake to find nothing it may
            // send (`nextToPush`); the resume wakes it. (A burst of changes while paused woke
            // it once per change: a thread switch per request.)
            return (out.queue && !s.paused && s.link.tokenRefused == nil, out.whole)
        }
        // Kept on disk at once (SimulationTests: a kill -9 before the push).
        if let whole { try? saveBase(id, whole) }
        // Items parked by the rules are looked at again when a rules file changes, or a folder
        // moves (the rules above what it holds change with it); so is a push being decided now.
        if what != .writing { checkRules(why: "a change here") }
        if queued { wake.yield() }
    }

    /// When the tree's rules generation moved, every parked item is looked at again
    /// (`UploadQueue.rules(at:)`).
    func checkRules(why: String) {
        let generation = tree.rulesGeneration
        guard let n = state.withLock({ $0.push.queue.rules(at: generation) }), n > 0 else { return }
        trace("\(n) parked items looked at again: the rules may have changed (\(why))")
        wake.yield()
    }

    /// Every parked item is looked at again (`UploadQueue.unparkAll`).
    func unparkAll(why: String) {
        let n = state.withLock { $0.push.queue.unparkAll() }
        guard n > 0 else { return }
        trace("\(n) parked items looked at again: \(why)")
        wake.yield()
    }

    func pushLoop() async {
        var wakeups = wakes.makeAsyncIterator()
        while !Task.isCancelled {
            let next: ItemID? = await loop.turn(.pushDue) { nextToPush() }
            guard let id = next else {
                // Nothing ready: sleep until a change wakes us, or the tick loop does when a
                // back-off ends (a yield while busy is buffered, so none is lost); `stop()`
                // finishes the stream.
                if await wakeups.next() == nil { return }
                continue
            }
            if await !push(from: id) { return }
        }
    }

    /// A commit ready to go: the request, and what settling its answer needs.
    struct ReadyCommit {
        var id: ItemID
        var work: Work
        var request: CommitRequest
        var upTo: Int64

        enum Work {
            case commit(CommitWork)
            /// A delete of the server's `record` (this device's base, `base`).
            case delete(base: Base?, record: ServerItem)
        }
    }

    /// Pushes `first` and, while the items next in the queue are commits or deletes ready to
    /// go, theirs in the same request, in queue order (SyncCore `CommitBatch`: content to upload
    /// first sends the gathered ones first; so does a delete that must ask the server first).
    /// False when the engine is stopping.
    func push(from first: ItemID) async -> Bool {
        var gathered: [ReadyCommit] = []
        var batch = CommitBatch()
        var id = first
        while true {
            do {
                let (decided, upTo) = try await decide(id)
                switch decided {
                case .nothing, .askPresenters:
                    // Nothing to send: its push ends now, as it would alone (the record's
                    // events keep their order: a content upload apart may end before the request).
                    guard await ended(id) else { return await stopping(gathered.map(\.id)) }
                case .delete(let base, let cursor):
                    guard case .base(let record, let version) = CommitPlan.deleteBase(base) else {
                        // Already gone, or its create's answer was lost (the server is asked
                        // first): alone, after the commits gathered before it.
                        guard await send(gathered) else { return await stopping([id]) }
                        return await pushDelete(id, base: base, cursor: cursor, upTo: upTo)
                    }
                    // Joins the request after the commits gathered before it: the server takes a
                    // request's commits in the order sent, each on its own (`CommitBatch.next`).
                    gathered.append(ReadyCommit(id: id, work: .delete(base: base, record: record),
                                                request: Self.deleteRequest(id, of: record, on: version, seen: cursor), upTo: upTo))
                    batch.add(chunks: 0, inlineBytes: 0)
                case .commit(let c):
                    if batch.holds(.init(parent: c.draft.parent, name: c.draft.name)) {
                        trace("push \(id): a commit gathered puts its item at the same name; decided again after their answers")
                        state.withLock { s in
                            s.push.queue.landed(id)
                            s.push.queue.prepend(id)
                        }
                        return await send(gathered)
                    }
                    if !gathered.isEmpty, CommitBatch.next(needsContent: c.needsContent, size: c.size) == .sendFirst {
                        guard await send(gathered) else { return await stopping([id]) }
                        gathered = []
                        batch = CommitBatch()
                    }
                    if let ready = try await readyCommit(id, c, upTo: upTo) {
                        gathered.append(ready)
                        batch.add(chunks: ready.request.state.chunks.count, inlineBytes: ready.request.inline?.reduce(0) { $0 + $1.bytes.count } ?? 0,
                                  place: .init(parent: ready.request.state.parent, name: ready.request.state.name))
                    } else {
                        guard await ended(id) else { return await stopping(gathered.map(\.id)) }
                    }
                }
            } catch {
                // The gathered ones first, as they would have gone alone; then this one's failure.
                guard await send(gathered) else { return await stopping([id]) }
                return await failed(id, error)
            }
            if batch.isFull || Task.isCancelled { break }
            guard let next = await loop.turn(.pushDue, { nextToPush(gathering: true) }) else { break }
            id = next
        }
        return await send(gathered)
    }

    /// Sends the gathered commits (one alone as `commit`, several as one `commitBatch`) and ends
    /// each push in queue order: an answer settled, or a failure taken (when the request failed
    /// as a whole, in reverse, so the items keep their order at the head of the queue). False
    /// when the engine is stopping.
    func send(_ gathered: [ReadyCommit]) async -> Bool {
        guard !gathered.isEmpty else { return true }
        state.withLock { s in
            for c in gathered {
                let d = c.request.state
                s.items[c.id]?.upload.sentPlace = d.deleted ? nil : ItemTable.Place(parent: d.parent, name: d.name)
            }
        }
        var answers: [Result<CommitResponse, any Error>] = []
        var whole: (any Error)?
        if gathered.count == 1, let c = gathered.first {
            do { answers = [.success(try await client.commit(container, c.request))] } catch { answers = [.failure(error)] }
        } else {
            trace("push: \(gathered.count) commits in one request")
            do {
                let results = try await client.commitBatch(container, gathered.map(\.request))
                answers = results.map { $0.mapError { $0 } }
            } catch {
                whole = error
            }
        }
        if let whole {
            for c in gathered.reversed() {
                guard await failed(c.id, whole) else { return await stopping(gathered.prefix { $0.id != c.id }.map(\.id)) }
            }
            return true
        }
        for (i, c) in gathered.enumerated() {
            let rest = gathered.dropFirst(i + 1).map(\.id)
            do {
                switch c.work {
                case .commit(let work):
                    let r = try answers[i].get()
                    try await loop.turn(.commitAnswered(c.id)) { try commitAnswered(c.id, work, r, upTo: c.upTo) }
                case .delete(let base, let record):
                    try await deleteAnswered(c.id, answers[i], record: record, sent: c.request, base: base)
                    try store.removeSyncOps(c.id, upTo: c.upTo)
                }
            } catch {
                guard await failed(c.id, error) else { return await stopping(rest) }
                continue
            }
            guard await ended(c.id) else { return await stopping(rest) }
        }
        return true
    }

    /// The push of `id` is over: what waited for it goes in; when the queue is empty, what was
    /// in the way of skipped remote items has moved. False when the engine is stopping.
    private func ended(_ id: ItemID) async -> Bool {
        let retry: [ServerItem]
        do { retry = try await loop.turn(.pushEnded(id)) { try pushEnded(id) } } catch {
            return await failed(id, error)
        }
        do { try await retrySkipped(retry) } catch {
            log("showing skipped remote items failed: \(error)")
        }
        return true
    }

    /// The push of `id` failed: the change stays queued (in memory and on disk) whatever the
    /// error; it leaves the queue only when the server has it. False when the engine is stopping.
    private func failed(_ id: ItemID, _ error: any Error) async -> Bool {
        if Task.isCancelled { return await stopping([id]) }
        let failure = Self.classify(error)
        let (delay, putBack) = await loop.turn(.pushFailed(id)) { pushFailed(id, error, failure) }
        switch failure {
        case .unauthorized: log("upload of \(id) refused: \(error); uploads wait for a valid token (mount again with --token-file)")
        case .transient: log("upload of \(id) failed: \(error); retrying in \(delay) s")
        case .refused: log("upload of \(id) refused: \(error); kept queued, retrying in \(delay) s or when it changes")
        case .overQuota: log("upload of \(id) refused for the account's quota: \(error); kept queued, retrying in \(delay) s")
        case .moveRefused: log("upload of \(id) refused: \(error); putting it back where the server has it")
        }
        // The conflict rule for crossing moves (docs/protocol.md "Commit"): the mover's
        // device puts the folder back where the server has it. Only the refused move is
        // undone; nothing else of the item was in it (folders have no content).
        if putBack { await revertToServer(id) }
        offlineIfUnreachable(error, failure)
        return true
    }

    /// The engine is stopping with these pushes not ended: they stay queued, first, in their
    /// order (in a turn), and go at the next start. Returns false.
    private func stopping(_ ids: [ItemID]) async -> Bool {
        guard let first = ids.first else { return false }
        await loop.turn(.pushFailed(first)) {
            state.withLock { s in
                s.push.upload = nil
                for id in ids.reversed() {
                    s.push.queue.landed(id)
                    s.push.queue.prepend(id)
                }
            }
        }
        for id in ids { log("upload of \(id) stopped: the engine is stopping; it stays queued and goes at the next start") }
        return false
    }

    /// The next item to push, taken from the queue and marked in flight (in a turn); nil when
    /// none is ready. A folder above it that is not on the server yet goes first.
    func nextToPush(gathering: Bool = false) -> ItemID? {
        let now = options.clock.now
        let next: ItemID? = state.withLock { s in
            guard !s.push.queue.isEmpty, !s.paused, s.link.tokenRefused == nil else { return nil }
            // An item waiting out its back-off stays in its place; the next ready one goes
            // (one item the server refuses for a while never holds up the others). A paced
            // item (a file that keeps changing, SyncCore `UploadPacing`) waits the same way.
            // An item queued again while its push is on its way (gathered into this request)
            // goes after that push ends.
            let flying = s.push.queue.inFlight
            return s.push.queue.takeNext(where: { !flying.contains($0) && (s.items[$0]?.upload.ready(at: now) ?? true) })
        }
        guard let id = next else { return nil }
        // A folder above it that is not on the server yet (its queue entry came later, e.g.
        // re-queued after a restart) is created first, or the server answers
        // parent_not_found and the item, retried at the front, would wait forever.
        let first = folderToCreateFirst(for: id)
        // The item the server has at its name goes first when it left it here (SyncCore
        // `CommitPlan.pushOrder`, `nameFirst`).
        let item: ItemID
        var folderAhead: ItemID?
        switch CommitPlan.pushOrder(start: first ?? id, taken: id,
                                    folderFirst: { folderAhead = folderToCreateFirst(for: $0); return folderAhead },
                                    nameFirst: { nameToFreeFirst(for: $0, cycle: $1) }) {
        case .push(let i):
            item = i
        case .nextRequest(let i):
            // Nothing but a request being gathered is in flight here.
            guard gathering else { item = i; break }
            trace("push \(id): the item the server has at its name here is in the request being gathered; it goes in the next")
            state.withLock { s in
                s.push.queue.landed(id)
                s.push.queue.prepend(id)
            }
            return nil
        case .wait(let until):
            // (The item inside a folder that waits, or behind an item that waits, waits as long.)
            trace("push \(id): its name here (or one it must free first) is still another item's on the server, whose push waits; so does this one, for \(until - options.clock.now)")
            state.withLock { $0.push.queue.landed(id) }
            askAgain(id, at: until, keepingPlace: true)
            return nextToPush(gathering: gathering)
        }
        if item == folderAhead, item != first {
            trace("push \(id): the item at its name on the server (or one before it) moved here into the folder \(item), which the server does not have yet; that folder goes first")
        } else if item != id, item != first {
            trace("push \(id): its name here is still \(item)'s on the server (or that of one before it); that push goes first")
        }
        guard item != id else { return id }
        let rules = pacingRules
        state.withLock { s in
            if item == first || item == folderAhead { s.items[item, default: SyncItem()].upload.on(.pushedAhead, at: now, rules: rules) }
            s.push.queue.sendFirst(item, before: id)
        }
        return item
    }

    /// What goes before `id`'s push about the item the server has at the place `id` takes here
    /// (SyncCore `CommitPlan.nameFirst`).
    /// `cycle`: the items this one is pushed first for; one of them at its name is a cycle (a
    /// swap), and this one goes.
    func nameToFreeFirst(for id: ItemID, cycle: Set<ItemID> = []) -> CommitPlan.NameFirst<ContinuousClock.Instant>? {
        let fs = tree
        guard let local = fs.localState(id), let parent = local.parent, let name = try? ItemName(local.name) else { return nil }
        let place = ItemTable.Place(parent: parent, name: name)
        guard let holder = state.withLock({ $0.items.holder(of: place) }), holder != id, !cycle.contains(holder) else { return nil }
        let there = fs.localState(holder)
        let leftHere = there.map { $0.parent != parent || !ItemName.same($0.name, local.name) } ?? true
        let now = options.clock.now
        return state.withLock { s in
            let q = s.push.queue
            let decision = CommitPlan.nameFirst(
                .init(id: holder, queued: q.contains(holder), parked: q.parked.contains(holder), onItsWay: q.isInFlight(holder),
                      leftHere: leftHere, shownThere: s.items[holder]?.base.map { !$0.record.deleted && ItemTable.Place(parent: $0.record.parent, name: $0.record.name) == place } ?? false,
                      gone: there == nil, upload: s.items[holder]?.upload),
                waitingSince: s.push.nameWaits[id], now: now)
            if case .waitUntil? = decision, s.push.nameWaits[id] == nil { s.push.nameWaits[id] = now }
            return decision
        }
    }

    /// The push of `id` is over (in a turn): a state held for it goes in now, also when the push
    /// ended without a commit (a delete the server had already). Returns the skipped remote
    /// states to try again when the queue is empty.
    func pushEnded(_ id: ItemID) throws -> [ServerItem] {
        // Pushed and nobody writing it any more: it is not "being written" (the tick loop
        // also clears this).
        let ws = tree.writeState(id)
        let closed = ws.map { $0.writers == 0 } ?? true
        let writing = ws.map { $0.writers > 0 || $0.dirty } ?? false
        let now = options.clock.now, rules = pacingRules
        let (retry, held): ([ServerItem], ServerItem?) = state.withLock { s in
            let held = s.items[id]?.remote.releaseAfterPush(writing: writing, queued: s.push.queue.contains(id) || s.push.queue.parked.contains(id))
            s.push.queue.landed(id); s.push.upload = nil
            s.push.nameWaits[id] = nil
            s.items[id]?.upload.on(.pushEnded(closed: closed), at: now, rules: rules)
            s.link.pushesClear(anyQueuedFailure: s.items.failed.contains { s.push.queue.contains($0) })
            return (s.push.queue.isEmpty && s.push.queue.inFlight.isEmpty ? s.skippedRemote() : [], held)
        }
        if let held {
            do { try apply([held]) } catch {
                log("showing v\(held.version) of \(id) failed: \(error); the next start lists the container again")
                markRelist()
            }
        }
        return retry
    }

    /// A push failed (in a turn): the item's record takes the failure, and the engine carries out
    /// what it answers (`UploadState.Action`). Returns the back-off in seconds and whether the
    /// item is to be put back where the server has it.
    func pushFailed(_ id: ItemID, _ error: any Error, _ failure: UploadFailure) -> (Int, Bool) {
        let now = options.clock.now, rules = pacingRules
        // What the item's error says, and the engine's last error.
        let (message, why) = (failure.message("\(error)"), failure.why("\(error)"))
        let event = UploadState<ContinuousClock.Instant>.Event.failed(
            failure, message: message, missingChunks: (error as? RemoteError)?.code == .missingChunks)
        let (delay, putBack): (Int, Bool) = state.withLock { s in
            s.push.queue.landed(id)
            if s.push.upload?.item == id { s.push.upload = nil }
            s.link.lastError = "upload of \(id): \(why)"
            var delay = 0, putBack = false
            for action in s.items[id, default: SyncItem()].upload.on(event, at: now, rules: rules) {
                switch action {
                case .retryIn(let seconds): delay = seconds
                case .queueFirst: s.push.queue.prepend(id)
                case .waitForToken:
                    s.link.refuseToken("\(error)")
                case .putBack:
                    // Until the server's state is shown the tree holds a place the server never
                    // had: the next pull (or start) lists the container again.
                    s.pull.relist.due = true
                    putBack = true
                case .queue, .keepPlace: break
                }
            }
            return (delay, putBack)
        }
        if putBack {
            markRelist()
            try? store.removeSyncOps(id, upTo: Int64.max)
        }
        return (delay, putBack)
    }

    /// The back-offs of items that failed to upload and the token check: wakes the push loop
    /// when one is due (called by the tick loop every second).
    func wakeForRetries() {
        let now = options.clock.now
        let due = state.withLock { s in s.push.queue.items.contains { s.items[$0]?.upload.failure.map { $0.at <= now } ?? false } }
        if due { wake.yield() }
    }

    /// A move the server refused (a cycle made together with another device's move): the item
    /// goes back to where the server has it, and what waited for it is shown.
    func revertToServer(_ id: ItemID) async {
        do {
            let item = try await client.item(container, id)
            let skipped = try await loop.turn(.reverted(id)) {
                let now = options.clock.now, rules = pacingRules
                state.withLock { s in _ = s.items[id]?.upload.on(.putBack, at: now, rules: rules) }
                try apply([item], force: [id])
                return state.withLock { $0.skippedRemote() }
            }
            try await retrySkipped(skipped)
            log("the move of \(item.name.value) was refused by the server (a cycle); put back where the server has it")
        } catch {
            log("could not put \(id) back after a refused move: \(error)")
        }
    }

    /// The topmost folder above `id` that exists here but was never committed (no base), unless
    /// its upload failed for good; nil when every folder above is on the server.
    func folderToCreateFirst(for id: ItemID) -> ItemID? {
        let fs = tree
        let above = fs.ancestors(of: id).filter { !$0.isRoot }
        return state.withLock { s in
            CommitPlan.folderFirst(above: above, onItsWay: { s.push.queue.isInFlight($0) }, { s.items[$0] })
        }
    }

    /// A failed request as SyncCore's `UploadFailure`: no answer (transport, certificate) is
    /// transient; an answer by its status and the server's code; a file that cannot be read here
    /// is refused (its state cannot be sent as it is). None of them drops the change.
    static func classify(_ e: any Error) -> UploadFailure {
        guard let r = e as? RemoteError else { return e is ChunkReadError || e is TooLargeToSync ? .refused : .transient }
        switch r {
        case .transport, .certificate: return .of(status: nil)
        case .unexpected(let status, _): return .of(status: status)
        case .server(let status, _, _, _, let quota): return .of(status: status, code: r.code, quota: quota)
        }
    }

    /// The server answered, but in trouble (5xx): worth asking again soon.
    static func isServerTrouble(_ e: any Error) -> Bool {
        if case .server(let status, _, _, _, _)? = e as? RemoteError { return status >= 500 }
        return false
    }

    /// An upload that could not reach the server says so in the status at once.
    func offlineIfUnreachable(_ error: any Error, _ failure: UploadFailure) {
        if failure == .transient, Self.isTransport(error) { setConnection(.offline(retryIn: nil), error: "\(error)") }
    }

    static func isTransport(_ e: any Error) -> Bool {
        switch e as? RemoteError {
        case .transport, .certificate: return true
        default: break
        }
        return false
    }

    /// What the decision turn of a push found to send (`decidePush`).
    enum PushWork {
        /// Nothing to send now (kept on this device, waiting for a writer, a lock or a save,
        /// paced): decided and recorded in the turn.
        case nothing
        /// Ask the file's presenters to save first, then decide again.
        case askPresenters(path: String)
        case delete(base: Base?, cursor: Int64)
        case commit(CommitWork)
    }

    /// A commit being prepared: what the decision turn read, and the draft it built.
    struct CommitWork {
        var base: Base?
        var cursor: Int64
        var draft: ItemDraft
        /// The file's content is read and its missing chunks uploaded before the commit.
        var needsContent: Bool
        /// A snapshot of a file kept open (its write generation): the queue entries stay.
        var snapshot: UInt64?
        /// The write generation the content is read at: a commit answer that replaces it is not
        /// shown over a write made after (settle).
        var generation: UInt64?
        /// The file's size when decided.
        var size: Int64 = 0
        /// The bytes of a small file's one chunk, sent inside the commit (`ContentSend.inline`).
        var inline: InlineChunk?
        /// The place is one this device chose beside a local-only item (`CommitRequest.placeIfUnmoved`).
        var placeIfUnmoved = false
    }


    /// The push's decision, in turns (presenters asked to save first when it concerns a file's
    /// content), and how far the item's queue entries go.
    func decide(_ id: ItemID) async throws -> (PushWork, Int64) {
        await store.queueCommitted()  // the queue entries of this item are in the table now (durable or not)
        let upTo = try store.lastSyncOpSeq(id) ?? 0
        var work = try await loop.turn(.pushStep(id)) { try decidePush(id, upTo: upTo, askPresenters: true) }
        if case .askPresenters(let path) = work, let presenters = services?.presenters {
            // Presenters of the file write what they have not saved yet (bounded;
            // docs/presenters.md), then the facts are read again: a presenter that saves makes
            // it a file being written, and its close queues it again.
            _ = await presenters.ask(.save, paths: [path])
            work = try await loop.turn(.pushStep(id)) { try decidePush(id, upTo: upTo, askPresenters: false) }
        }
        return (work, upTo)
    }

    /// A commit's content read (and uploaded unless it goes inside), then its request built in a
    /// turn; nil when there is nothing to send now (content going up apart, a write started
    /// while chunking, nothing changed).
    func readyCommit(_ id: ItemID, _ work: CommitWork, upTo: Int64) async throws -> ReadyCommit? {
        var c = work
        if c.needsContent {
            let fs = tree
            if let up = await loop.turn(.contentSent(id), { takeContentUp(id, c, fs: fs) }) {
                c.draft.chunks = up
            } else if c.snapshot == nil, c.size >= options.contentApartBytes, !Mutation.bigContentInQueue.isOn {
                await loop.turn(.contentApart(id)) { sendContentApart(id, c, upTo: upTo, fs: fs) }
                return nil
            } else {
                // nil: a write started while chunking; its close queues the item again.
                guard let content = try await uploadContent(id, known: c.base?.record.chunks, fs: fs, snapshot: c.snapshot, inline: true) else { return nil }
                c.draft.chunks = content.chunks
                c.inline = content.inline
            }
        }
        guard let request = try await loop.turn(.contentSent(id), { try commitRequest(id, c, upTo: upTo) }) else { return nil }
        return ReadyCommit(id: id, work: .commit(c), request: request, upTo: upTo)
    }

    /// The chunks uploaded apart for this commit, when they are of the file as it is now (in a
    /// turn); they are used once.
    private func takeContentUp(_ id: ItemID, _ c: CommitWork, fs: any MountedTree) -> [ChunkRef]? {
        guard let up = state.withLock({ $0.push.contentUp.removeValue(forKey: id) }) else { return nil }
        return up.generation == c.generation && fs.writeState(id)?.generation == c.generation ? up.chunks : nil
    }

    /// A big file's content goes up apart from the queue (in a turn): the item keeps its place
    /// (every rule that looks for local work sees it) but waits, and the push loop takes the
    /// next item. When the content is up, the item is pushed again and commits those chunks.
    private func sendContentApart(_ id: ItemID, _ c: CommitWork, upTo: Int64, fs: any MountedTree) {
        let now = options.clock.now, rules = pacingRules
        state.withLock { s in
            s.items[id, default: SyncItem()].upload.on(.contentApart, at: now, rules: rules)
            s.push.queue.prepend(id)
        }
        trace("push \(id): \(c.size) bytes of content go up apart from the queue")
        jobs.spawn {
            let outcome: Result<[ChunkRef]?, any Error>
            do { outcome = .success(try await self.uploadContent(id, known: c.base?.record.chunks, fs: fs, snapshot: nil, inline: false)?.chunks) } catch {
                outcome = .failure(error)
            }
            if Task.isCancelled { return }  // stopping: the item stays queued for the next start
            // The item stays queued whatever came of it: pushed again, its decision is made on
            // the facts of then (a writer, a lock, a delete made meanwhile), and the chunks are
            // used only for the write generation they were read at.
            let failed: (Int, UploadFailure, any Error)? = await self.loop.turn(.contentReady(id)) {
                let now = self.options.clock.now, rules = self.pacingRules
                let apart = self.state.withLock { s -> Bool in
                    guard s.items[id]?.upload.wait == .content else { return false }  // deleted here since
                    s.items[id]?.upload.on(.contentDone, at: now, rules: rules)
                    if case .success(let chunks?) = outcome { s.push.contentUp[id] = (c.generation, chunks) }
                    return true
                }
                guard apart, case .failure(let error) = outcome else { return nil }
                let failure = Self.classify(error)
                return (self.pushFailed(id, error, failure).0, failure, error)
            }
            if let (delay, failure, error) = failed {
                self.log("upload of the content of \(id) failed: \(error); retrying in \(delay) s")
                self.offlineIfUnreachable(error, failure)
            }
            self.wake.yield()
        }
    }

    /// The push's decision (in a turn): the item's facts read at once, `SyncItem.pushStep`, and
    /// what it leads to.
    func decidePush(_ id: ItemID, upTo: Int64, askPresenters: Bool) throws -> PushWork {
        let (fs, base, cursor, rulesEpoch) = state.withLock { s in (s.fs, s.base(id), s.pull.cursor, s.push.queue.rulesEpoch) }
        let tree = fs.snapshot(id)
        let local = tree.local
        trace("push \(id): base v\(base?.version ?? -1)\(local == nil ? ", gone here" : "")")
        let verdict = ignoreVerdict(id, here: local != nil, base: base)
        let ignored: Bool? = verdict.map { if case .ignored = $0 { true } else { false } }
        let step = state.withLock { $0.items[id] ?? SyncItem() }.pushStep(pushFacts(id, tree, base: base, ignored: ignored), rules: pacingRules)
        if askPresenters, local?.kind == .file, let presenters = services?.presenters, !presenters.isEmpty, step.concernsContent {
            return .askPresenters(path: fs.path(of: id))
        }
        let now = options.clock.now, rules = pacingRules
        state.withLock { s in
            for event in step.uploadEvents(isFile: local?.kind == .file, hasBase: base != nil) {
                s.items[id, default: SyncItem()].upload.on(event, at: now, rules: rules)
            }
        }
        var snapshot: UInt64?
        switch step {
        case .waitForBelow(let until):
            trace("push \(id): a folder delete waits for the pushes of items below it on the server")
            askAgain(id, at: until, keepingPlace: true)
            return .nothing
        case .commitDelete:
            // Never tell the server we saw items we skipped: it would delete them with the folder.
            // Nor states held back here (for a push, a writer or a lock): another device's
            // write this device never showed would go with the folder (`SeenCursor`).
            let seen = state.withLock { s in
                SeenCursor.forDelete(cursor: cursor, notShown: s.items.heldVersions + (s.pull.minSkipped.map { [$0] } ?? []))
            }
            return .delete(base: base, cursor: seen)
        case .keepLocal:
            // SQLite's journals stay on this device (DeviceLocalNames).
            try store.removeSyncOps(id, upTo: upTo)
            return .nothing
        case .park:
            // Its queue entries stay on disk: a restart looks at it again, and so does the next
            // change of the rules (`unparkAll`).
            guard state.withLock({ $0.push.queue.park(id, decidedAt: rulesEpoch) }) else {
                trace("push \(id): changed, or the rules did, while it was decided; looked at again")
                wake.yield()
                return .nothing
            }
            if case .ignored(let rule, let folder)? = verdict {
                trace("push \(id): ignored here by \"\(rule.text)\" (/\((folder + [".nimbusignore"]).joined(separator: "/")) line \(rule.line)); parked")
            } else {
                trace("push \(id): the .nimbusignore rules above it are not here yet; parked")
            }
            return .nothing
        case .waitForNotice(let until):
            trace("push \(id): a change here is on its way to the engine; asked again in a moment")
            askAgain(id, at: until, keepingPlace: true)
            return .nothing
        case .waitForSafeSave(let until):
            // A new file under the name a document was just renamed away from (vim's save): wait
            // a moment — when the backup goes, this file takes the document's identity instead.
            // It keeps its place in the queue (local work a folder delete must see).
            askAgain(id, at: until, keepingPlace: !Mutation.safeSaveHoldLeavesQueue.isOn)
            return .nothing
        case .waitForWriter:
            // Mid-save (open for writing, no fsync since the last write): never upload a
            // half-written file. The queued ops stay; the writer's close or fsync queues the item
            // again. After a quiet period without writes (tick loop) a snapshot goes: chunked
            // between two equal write generations, so no write tore it.
            return .nothing
        case .waitForLock:
            // A program holds the file exclusively (mid-save): its unlock queues the item again.
            return .nothing
        case .paced(let until):
            // A file that keeps changing keeps its place in the queue until then.
            state.withLock { $0.push.queue.prepend(id) }
            trace("push \(id): changing again soon after its last upload; paced for \(until - now)")
            return .nothing
        case .commit(let s):
            snapshot = s
        }
        guard let local, let parent = local.parent, let name = try? ItemName(local.name) else { return .nothing }
        // The tree may have changed since the item was taken (a rename over another item whose
        // notice is still on its way): the item at its name now is looked at again with this
        // snapshot. (The order among pushes was settled when it was taken.)
        if case .waitUntil(let until)? = nameToFreeFirst(for: id) {
            trace("push \(id): its name here is still another item's on the server, whose change is on its way; asked again in a moment")
            askAgain(id, at: until, keepingPlace: true)
            return .nothing
        }
        var draft = ItemDraft(kind: local.kind, parent: parent, name: name, symlinkTarget: local.target,
                              mode: local.mode & ItemLimits.syncedPermissions, modified: WireRange.clampTime(local.mtime),
                              extra: XattrRules.draftExtra(base: base?.record.extra, here: tree.xattrs))
        var needsContent = false
        switch CommitPlan.contentSource(isFile: local.kind == .file, base: base) {
        case .none: break
        case .base(let chunks): draft.chunks = chunks
        case .read: needsContent = true
        }
        return .commit(CommitWork(base: base, cursor: cursor, draft: draft, needsContent: needsContent, snapshot: snapshot,
                                  generation: tree.write?.generation, size: local.size, placeIfUnmoved: tree.placedBeside))
    }

    /// The push of `id` is looked at again at `until`: kept at the head of the queue meanwhile
    /// (`keepingPlace`: local work every rule that looks at the queue sees), or put back then.
    private func askAgain(_ id: ItemID, at until: ContinuousClock.Instant, keepingPlace: Bool) {
        if keepingPlace {
            let now = options.clock.now, rules = pacingRules
            state.withLock { s in
                s.items[id, default: SyncItem()].upload.on(.askAgain(until: until), at: now, rules: rules)
                s.push.queue.prepend(id)
            }
        }
        let clock = options.clock
        jobs.spawn {
            await clock.sleep(for: until - clock.now)
            if !keepingPlace { self.state.withLock { $0.push.queue.append(id) } }
            self.wake.yield()
        }
    }

    /// The commit to send once the content is on the server (in a turn); nil when there is
    /// nothing to send.
    func commitRequest(_ id: ItemID, _ c: CommitWork, upTo: Int64) throws -> CommitRequest? {
        // A save that leaves everything but the modification time as it was sends nothing (no
        // false conflicts); a time set on purpose (touch -d, cp -p, rsync -t: an "attributes"
        // change) is sent.
        let timeSet = try c.base.map { $0.record.modified != c.draft.modified } == true
            && store.hasSyncOp(id, kind: .attributes)
        let unanswered = state.withLock { $0.items[id]?.upload.unanswered ?? false }
        if CommitPlan.nothingToSend(base: c.base?.record, draft: c.draft, timeSetOnPurpose: timeSet, unanswered: unanswered) {
            trace("push \(id): nothing to send")
            try store.removeSyncOps(id, upTo: upTo)  // nothing the server does not have
            try applyHeldForWriter(id)
            return nil
        }
        return CommitRequest(item: id, baseVersion: Mutation.commitWithoutBase.isOn ? nil : c.base?.version, state: c.draft, seenCursor: c.cursor,
                             inline: c.inline.map { [$0] }, placeIfUnmoved: c.placeIfUnmoved ? true : nil)
    }

    /// A newer version that waited for this file's push or writer goes in now, when no program
    /// is writing it (in a turn).
    private func applyHeldForWriter(_ id: ItemID) throws {
        let fs = tree
        guard let ws = fs.writeState(id) else { return }
        let held: ServerItem? = state.withLock { s in
            guard let held = s.items[id]?.remote.releaseAfterPush(writing: ws.writers > 0 || ws.dirty, queued: false) else { return nil }
            s.push.queue.landed(id)
            return held
        }
        if let held { try apply([held]) }
    }

    /// The server's answer to the commit (in a turn).
    func commitAnswered(_ id: ItemID, _ c: CommitWork, _ r: CommitResponse, upTo: Int64) throws {
        let draft = c.draft
        trace("commit \(id) \(draft.name.value) on v\(c.base?.version ?? -1): \(r.outcome.rawValue) v\(r.item.version)\(r.yours.map { " yours=" + $0 } ?? "")\(r.item.deleted ? " deleted" : "")"
              + (SyncedXattrs.of(draft.extra).map { " sent xattrs [\($0.keys.sorted().joined(separator: ","))]" } ?? "")
              + (SyncedXattrs.of(r.item.extra).map { " xattrs [\($0.keys.sorted().joined(separator: ","))]" } ?? ""))
        // The server's answer covers any version that waited for this upload.
        state.withLock { $0.items[id]?.remote.answered(r.item.version) }
        try settle(id, sent: draft, response: r, previous: c.base, generation: c.generation)
        services?.events.append(r.outcome == .conflict ? .conflict : .uploaded, origin: .sync, path: tree.path(of: id),
                                detail: "v\(r.item.version)" + (r.outcome == .conflict ? " yours=\(r.yours ?? "?")" : ""))
        for next in CommitPlan.afterAnswer(snapshot: c.snapshot) {
            switch next {
            case .applyHeld:
                // A version newer than this commit arrived while it was on its way.
                try applyHeldForWriter(id)
            case .snapshotSent(let snapshot):
                let now = options.clock.now, rules = pacingRules
                state.withLock { _ = $0.items[id, default: SyncItem()].upload.on(.snapshotSent(snapshot), at: now, rules: rules) }
            case .removeQueued:
                try store.removeSyncOps(id, upTo: upTo)
            }
        }
    }

    /// A delete, alone: sent, its queue entries dropped, its push ended. False when the engine
    /// is stopping.
    private func pushDelete(_ id: ItemID, base: Base?, cursor: Int64, upTo: Int64) async -> Bool {
        do {
            try await pushDelete(id, base: base, cursor: cursor)
            try store.removeSyncOps(id, upTo: upTo)
        } catch {
            return await failed(id, error)
        }
        return await ended(id)
    }

    private func pushDelete(_ id: ItemID, base: Base?, cursor: Int64) async throws {
        let record: ServerItem, baseVersion: Int64
        switch CommitPlan.deleteBase(base) {
        case .alreadyDeleted:
            return
        case .base(let r, let version):
            (record, baseVersion) = (r, version)
        case .askServer:
            guard let created = try await createdWithoutAnswer(id) else {
                trace("delete \(id): never uploaded, nothing to send")
                return
            }
            (record, baseVersion) = created
        }
        let request = Self.deleteRequest(id, of: record, on: baseVersion, seen: cursor)
        let answer: Result<CommitResponse, any Error>
        do { answer = .success(try await client.commit(container, request)) } catch { answer = .failure(error) }
        try await deleteAnswered(id, answer, record: record, sent: request, base: base)
    }

    /// The commit that deletes `record` (the server's state at `version`).
    static func deleteRequest(_ id: ItemID, of record: ServerItem, on version: Int64, seen cursor: Int64) -> CommitRequest {
        var d = ItemDraft(record)
        d.deleted = true
        return CommitRequest(item: id, baseVersion: version, state: d, seenCursor: cursor)
    }

    /// Settles the server's answer to the delete `sent` of `record` (this device's base `base`),
    /// sent alone or in a request of several.
    private func deleteAnswered(_ id: ItemID, _ answer: Result<CommitResponse, any Error>, record: ServerItem, sent: CommitRequest, base: Base?) async throws {
        let d = sent.state, baseVersion = sent.baseVersion ?? -1
        let r: CommitResponse
        do {
            r = try answer.get()
        } catch let e as RemoteError {
            guard let actions = DeleteAnswer.gone(code: e.code) else { throw e }
            try await loop.turn(.commitAnswered(id)) {
                trace("delete \(id) on v\(baseVersion): the server has no such item any more (purged); done")
                let answer = AnswerContext(id: id, item: record, yours: nil, sent: d, previous: base, relocate: false, generation: nil, wholeNow: false)
                for action in actions { try settleAction(action, answer) }
            }
            return
        }
        let cameBack = try await loop.turn(.commitAnswered(id)) { () throws -> Bool in
            trace("delete \(id) on v\(baseVersion): \(r.outcome.rawValue) v\(r.item.version)\(r.item.deleted ? " deleted" : "")")
            // The answer covers any version that waited for this push.
            state.withLock { $0.items[id]?.remote.answered(r.item.version) }
            let actions = DeleteAnswer.actions(r.item)
            let answer = AnswerContext(id: id, item: r.item, yours: nil, sent: d, previous: base, relocate: false, generation: nil, wholeNow: false)
            for action in actions { try settleAction(action, answer) }
            return actions.contains(.listAgain)
        }
        if cameBack { try await relist() }
        // A version newer than the answer arrived while the delete was on its way (an edit made
        // elsewhere after the delete, which brought the item back): it goes in now, or the item
        // would stay gone on this device only (EngineSimTests).
        try await loop.turn(.pushEnded(id)) {
            let newer: ServerItem? = state.withLock { s in
                guard let held = s.items[id]?.remote.takeForWriter() else { return nil }
                s.push.queue.landed(id)
                return held
            }
            if let newer {
                trace("delete \(id): v\(newer.version) came while it was on its way; shown now")
                try apply([newer])
            }
        }
    }

    /// An item deleted here that has no base may still be on the server: its create was
    /// committed but the answer was lost (the connection dropped), and the device never learned.
    /// Skipping the delete would leave the item on every other device and gone here for good
    /// (EngineSimTests). The server is asked: no such item → nothing to send; else the
    /// delete goes on the item's first version — the state this device created (only the device
    /// that made an id creates it) — so an edit made elsewhere since wins, as edit vs delete
    /// does, and the item comes back here.
    private func createdWithoutAnswer(_ id: ItemID) async throws -> (ServerItem, Int64)? {
        let current: ServerItem
        do {
            current = try await client.item(container, id)
        } catch let e as RemoteError where e.code == .itemNotFound {
            return nil
        }
        if current.deleted { return nil }
        let first = try await client.versions(container, id).map(\.version).min() ?? current.version
        trace("delete \(id): no base here, but the server has it (v\(current.version), first v\(first)): its create's answer was lost")
        return (current, first)
    }

    /// Records the commit's answer as the new base. When the server's state differs from what
    /// was sent (a merge, a rename for a taken name, or our edit kept as a conflict version),
    /// the server's state is shown here.
    ///
    /// A file written since its content was read for the commit (`generation`) keeps its bytes:
    /// the answer waits like a remote version for a writer, and the new write is committed on its
    /// old base, so the server keeps it too (EngineSimTests: a write made while the commit of a
    /// conflict was on its way is not replaced by the server's current content).
    private func settle(_ id: ItemID, sent: ItemDraft, response r: CommitResponse, previous: Base?, generation: UInt64?) throws {
        assert(EngineLoop.inTurn, "settle outside a turn of the engine loop")
        let item = r.item
        let fs = tree
        let now = options.clock.now, rules = pacingRules
        let (relocate, record) = state.withLock { s in
            let record = s.items[id] ?? SyncItem()
            let actions = s.items[id]?.upload.on(.settling, at: now, rules: rules) ?? []
            return (actions.contains(.keepPlace), record)
        }
        let sameContent = item.chunks == sent.chunks
        let shown = ItemDraft(item).withModified(sent.modified)
        let facts = SettleFacts(
            deletedElsewhere: item.deleted && !sent.deleted,
            writtenSince: generation.map { fs.writeState(id)?.generation != $0 } ?? false,
            sameContent: sameContent,
            samePlace: shown.parent == sent.parent && shown.name == sent.name && shown.mode == sent.mode,
            existsHere: fs.localState(id) != nil,
            sameXattrs: SyncedXattrs.of(item.extra) ?? [:] == SyncedXattrs.of(sent.extra) ?? [:])
        // A file written (O_TRUNC) while the commit was on its way is whole here now, even if it
        // was a placeholder when the push began: it must not be marked "not downloaded" again, or
        // the next push sends the old chunks ("nothing to send") and the write never leaves.
        let current = state.withLock { $0.base(id) }
        let base = Base.fromAnswer(item, sent: sent.chunks, previous: previous, wholeNow: current.map(\.complete) ?? false)
        let step = record.planSettle(facts, isFile: item.kind == .file)
        trace("settle \(id) v\(item.version): \(step)")
        let answer = AnswerContext(id: id, item: item, yours: r.yours, sent: sent, previous: previous, relocate: relocate,
                                   generation: generation, wholeNow: current?.complete ?? false)
        for action in step.actions(answer: base, previous: previous, now: current, conflict: r.outcome == .conflict) {
            try settleAction(action, answer)
        }
    }

    /// What the actions of a commit's answer are carried out on.
    private struct AnswerContext {
        let id: ItemID
        let item: ServerItem
        let yours: String?
        let sent: ItemDraft
        let previous: Base?
        let relocate: Bool
        let generation: UInt64?
        let wholeNow: Bool
    }

    /// Carries out one action of a commit's answer (`SettleAction`; in a turn).
    private func settleAction(_ action: SettleAction, _ a: AnswerContext) throws {
        let fs = tree
        let (id, item, sent, previous, relocate, generation) = (a.id, a.item, a.sent, a.previous, a.relocate, a.generation)
        switch action {
        case .saveBase(let b):
            try saveBase(id, b)
        case .showAsPulled:
            // The push of this item is over: `apply` shows it (it holds states of items in flight).
            state.withLock { $0.push.queue.landed(id) }
            try apply([item])
        case .deleteShown(let version):
            state.withLock { $0.pull.deletesShown[id] = version }
        case .listAgain:
            break  // after the turn (pushDelete)
        case .logConflict:
            log("conflict on \(item.name.value): the server kept both (yours: \(a.yours ?? "?"))")
        case .show(let resetContent, let base):
            // In memory the base goes first (a read that sees the new size sees its presence); on
            // disk it goes after the tree change is committed, so a crash never leaves a base that
            // says the server's state is shown while the row is not.
            state.withLock { $0.setBase(id, base) }
            var shownState = Self.remoteState(item, resetContent: resetContent)
            shownState.unlessWrittenSince = generation
            // A rename, move or chmod made here since the draft stays (pushed next, on this
            // answer). After a commit on a base older than our own move, the local place stays too.
            shownState.sentPlace = relocate ? (item.parent, item.name.value, sent.mode) : (sent.parent, sent.name.value, sent.mode)
            shownState.sentXattrs = SyncedXattrs.of(sent.extra) ?? [:]
            let shown = !fs.show([shownState]).contains(id)
            trace("settle \(id) v\(item.version): \(shown ? "shown" : "not shown yet")")
            let here = fs.localState(id).map { (parent: $0.parent, name: $0.name) }
            let after = SettleShown(
                shown: shown, previous: previous, answer: base, answerIsSent: item.chunks == sent.chunks, isFile: item.kind == .file,
                wholeHere: a.wholeNow || fs.writeState(id)?.generation != generation,
                movedBack: SettleFacts.movedBackSinceCommit(previous: previous?.record, sent: sent, here: here, relocate: relocate),
                placeHereNewer: SettleFacts.placeHereNewer(relocate: relocate, here: here, answer: item))
            for next in after.actions { try settleAction(next, a) }
        case .holdAnswer:
            // Shown when the way is free: retried after pulls and pushes, and after a restart by
            // listing the container again.
            state.withLock { $0.items[id, default: SyncItem()].remote.skip(item) }
            markRelist()
        case .movedBack:
            let now = options.clock.now, rules = pacingRules
            state.withLock { _ = $0.items[id, default: SyncItem()].upload.on(.movedBackSinceCommit, at: now, rules: rules) }
            trace("settle \(id): moved back here since the commit; the next answer keeps the place here")
        case .persistShown(let base):
            try persistBases([id: base])
        case .pushAgain:
            trace("settle \(id) v\(item.version): the place here is newer; pushed again")
            localChange(.moved(id))
        }
    }

    /// What the `.nimbusignore` files say of `id`: of its place here, or for an item deleted here
    /// (`here` false), of its place on the server (its base's); `.none` for one the server never
    /// had or has deleted. Nil while a rules file on the way is not here yet.
    func ignoreVerdict(_ id: ItemID, here: Bool, base: Base?) -> IgnoreVerdict? {
        if here { return tree.ignoreVerdict(id) }
        guard let place = serverPath(id) else { return IgnoreVerdict.none }
        return tree.ignoreVerdict(path: place.path, isFolder: place.isFolder)
    }

    /// The item's path on the server as this device last synced it, from the bases of it and
    /// the folders above it; nil when one of them is not known here or deleted.
    func serverPath(_ id: ItemID) -> (path: [String], isFolder: Bool)? {
        state.withLock { s in
            guard let b = s.base(id)?.record, !b.deleted else { return nil }
            var names = [b.name.value]
            var p = b.parent
            for _ in 0..<4096 {
                if p.isRoot { return (names.reversed(), b.kind == .folder) }
                guard let pb = s.base(p)?.record, !pb.deleted else { return nil }
                names.append(pb.name.value)
                p = pb.parent
            }
            return nil
        }
    }

    /// The tree's facts about `id` for `SyncItem.pushStep`, from one snapshot of the tree.
    func pushFacts(_ id: ItemID, _ tree: TreeSnapshot, base: Base?, ignored: Bool?) -> PushFacts<ContinuousClock.Instant> {
        let local = tree.local
        let isFile = local?.kind == .file
        let ws = isFile ? tree.write : nil
        return PushFacts(
            exists: local != nil, isFile: isFile, hasBase: base != nil, complete: base?.complete ?? true,
            localOnly: isFile && base == nil && local.map { $0.isSpecial || DeviceLocalNames.matches($0.name) } == true,
            pendingSafeSave: isFile && base == nil && tree.pendingSafeSave,
            midSaveGeneration: ws?.unsynced == true ? ws?.generation : nil,
            lockedExclusively: isFile && services?.coordinator.programLock(on: id) == .exclusive,
            written: ws?.written ?? 0, unnoticedChange: ws?.unnoticed == true,
            belowStillToPush: local == nil && base?.record.kind == .folder && state.withLock { s in
                let q = s.push.queue
                let pending = Array(s.items.busy.filter { q.holdsFolderDelete($0) })
                return CommitPlan.deleteWaitsForBelow(id, pending: pending) { s.base($0)?.record.parent }
            },
            ignored: ignored, now: options.clock.now)
    }

    /// Paced items whose wait is over, or whose program has written enough since to earn the
    /// upload (called by the tick loop): cleared, so the push loop takes them.
    func releasePaced() {
        let now = options.clock.now
        let rules = pacingRules
        let waiting: [ItemID] = state.withLock { s in s.items.pacedIDs }
        guard !waiting.isEmpty else { return }
        let fs = tree
        var due = false
        for id in waiting {
            let written = fs.writeState(id)?.written ?? 0
            state.withLock { s in
                if s.items[id]?.upload.on(.waitLook(written: written), at: now, rules: rules).contains(.queue) == true { due = true }
            }
        }
        if due { wake.yield() }
    }

    /// The tree's write state as the upload's rule reads it.
    static func moment(_ w: WriteState) -> WriteMoment {
        WriteMoment(generation: w.generation, changing: w.changing, unsynced: w.unsynced)
    }

    /// A file's content as its commit sends it: the chunk list, and a small file's bytes.
    struct Content {
        var chunks: [ChunkRef]
        var inline: InlineChunk?
    }

    /// Chunks the cache file and uploads the chunks the server lacks, or, with `inline`, reads a
    /// small file's one chunk for the commit to carry (`ContentSend`). Every chunk sent is
    /// re-hashed as read, so a file changing underneath never sends bytes under a wrong hash
    /// (the change queues the item again and the next push sends the new content).
    private func uploadContent(_ id: ItemID, known: [ChunkRef]?, fs: any MountedTree, snapshot: UInt64?, inline: Bool) async throws -> Content? {
        var fd = Glibc.open(store.cache.path(for: id), O_RDONLY | O_CLOEXEC)
        // An empty file from elsewhere (complete, never opened here) has no cache file yet.
        if fd < 0 && errno == ENOENT { fd = fs.openCacheFile(id) } else if fd < 0 { fd = -errno }
        guard fd >= 0 else { throw SyncError("cannot read the cache file of \(id): \(String(cString: strerror(-fd)))") }
        defer { close(fd) }
        // A file beyond what a version may hold is refused before a byte of it is read (a
        // sparse file of 200 GiB takes no disk and would keep the push busy for minutes).
        var st = stat()
        let maxBytes = Int64(ProtocolLimits.maxChunksPerItem) * Int64(chunker.maxSize)
        if fstat(fd, &st) == 0, Int64(st.st_size) > maxBytes { throw TooLargeToSync(size: Int64(st.st_size), chunks: nil) }
        // Chunked under a read claim: the chunk list is the file's content at one instant, not
        // a mix of before and after a program's locked save. (Uploads re-hash what they send.)
        guard let claim = services?.coordinator.tryClaim(id, .shared, label: "sync: upload") else {
            let now = options.clock.now, rules = pacingRules
            state.withLock { _ = $0.items[id, default: SyncItem()].upload.on(.lockHeld, at: now, rules: rules) }
            return nil
        }
        // The write generation and the size at one instant: the content is the file's first
        // `size` bytes (the cache file may hold bytes past them that are not its content).
        let at = fs.snapshot(id)
        let before = at.write
        let written = before?.written ?? 0
        let spans: [ChunkSpan]
        do { spans = try chunker.chunks(fd: fd, length: at.local?.size) } catch { claim.release(); throw error }
        claim.release()
        if spans.count > ProtocolLimits.maxChunksPerItem {
            throw TooLargeToSync(size: spans.last.map { $0.offset + $0.ref.size } ?? 0, chunks: spans.count)
        }
        let refs = spans.map(\.ref)
        // What was chunked is one state of the file only when no write, truncation or identity
        // transfer ended while it was read (the generation is the same) and none is under way
        // now (its bytes land before its generation moves): a program that truncates, writes
        // and closes in that time would otherwise have its empty middle state committed. The
        // change's close or fsync queues the item again. A writer still mid-save (opened since
        // the check in push()) waits for its close or fsync too. A snapshot of a file kept open
        // is good when it is the generation the quiet period saw.
        let after = fs.writeState(id)
        guard CommitPlan.isOneState(before: before.map(Self.moment), after: after.map(Self.moment), snapshot: snapshot) else {
            trace("upload \(id): written while chunked or mid-save; sent after the change")
            return nil
        }
        let chunksMissing = state.withLock { $0.items[id]?.upload.chunksMissing == true }
        switch CommitPlan.contentSend(chunks: refs, known: known, chunksMissing: chunksMissing, inlineAllowed: inline) {
        case .known: return Content(chunks: refs)
        case .inline:
            let s = spans[0]
            var bytes = [UInt8](repeating: 0, count: Int(s.ref.size))
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, $0.count, off_t(s.offset)) }
            guard n == bytes.count, ContentHash(digest: SHA256.hash(data: bytes)) == s.ref.hash else {
                trace("upload \(id): the file changed while read; sent again after the change")
                return nil
            }
            let now = options.clock.now, rules = pacingRules
            state.withLock { st in
                _ = st.items[id, default: SyncItem()].upload.on(.uploaded(sent: s.ref.size, written: written), at: now, rules: rules)
                st.push.bytesSent += s.ref.size
            }
            return Content(chunks: refs, inline: InlineChunk(hash: s.ref.hash, bytes: Data(bytes)))
        case .ask: break
        }
        let missing = Set(try await client.missingChunks(Set(refs.map(\.hash)).sorted()))
        var sent = Set<ContentHash>()
        let total = spans.filter { missing.contains($0.ref.hash) }.reduce(Int64(0)) { $0 + $1.ref.size }
        state.withLock { $0.push.upload = (id, 0, total) }
        // Every attempt counts for pacing, also one the file's next change cut short.
        var put: Int64 = 0
        defer {
            let now = options.clock.now
            let rules = pacingRules
            state.withLock { _ = $0.items[id, default: SyncItem()].upload.on(.uploaded(sent: put, written: written), at: now, rules: rules) }
        }
        for s in spans where missing.contains(s.ref.hash) && sent.insert(s.ref.hash).inserted {
            var bytes = [UInt8](repeating: 0, count: Int(s.ref.size))
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, $0.count, off_t(s.offset)) }
            guard n == bytes.count, ContentHash(digest: SHA256.hash(data: bytes)) == s.ref.hash else {
                // Changed underneath: the change's close or fsync queues the item again, and the
                // next upload (paced) sends the new content.
                trace("upload \(id): the file changed while uploading; sent again after the change")
                return nil
            }
            try await client.putChunk(s.ref.hash, bytes)
            put += s.ref.size
            state.withLock { st in
                st.push.bytesSent += s.ref.size
                if st.push.upload?.item == id { st.push.upload!.sent += s.ref.size }
            }
        }
        return Content(chunks: refs)
    }
}
