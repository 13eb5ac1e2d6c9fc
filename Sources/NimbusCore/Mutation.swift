import Foundation

/// Sync rules broken on purpose, one at a time, to show that the tests catch each one's absence
/// (docs/sync.md "Mutations"; `scripts/mutate` runs the table). A debug build reads the name of
/// one mutation from `NIMBUS_MUTATE` once, in the test process and in every daemon it starts; a
/// release build never breaks a rule (`isOn` is always false there).
public enum Mutation: String, CaseIterable, Sendable {
    /// A local delete keeps the item's pacing wait (`UploadState.deletedHere` does nothing).
    case deleteWaitsOutPacing = "delete-waits-out-pacing"
    /// A delete's `seenCursor` covers states held back here (`SeenCursor.forDelete`).
    case deleteClaimsHeldStates = "delete-claims-held-states"
    /// A first upload held as a possible editor's save leaves the upload queue while it waits.
    case safeSaveHoldLeavesQueue = "safe-save-hold-leaves-queue"
    /// A pull replaces a file whose change the engine has not heard of yet.
    case pullOverlooksUnnoticedChange = "pull-overlooks-unnoticed-change"
    /// A server state is not held for a file open for writing here: SyncCore's writer hold
    /// (`planApply`, `notShown`) and the tree's check when it shows the state (`beingWritten`).
    case dropWriterHold = "drop-writer-hold"
    /// A remote state goes in although the item's own push is queued or on its way.
    case dropPushHold = "drop-push-hold"
    /// A folder deleted elsewhere goes although an item below has local work.
    case folderDeleteOverLocalWork = "folder-delete-over-local-work"
    /// A change of an item ignored here (`.nimbusignore`) is pushed like any other.
    case ignoredItemPushed = "ignored-item-pushed"
    /// A parked item holds back the delete of a folder above it made here: `rm -r` of a folder
    /// with an ignored synced file in it never reaches the server.
    case parkedHoldsFolderDelete = "parked-holds-folder-delete"
    /// A parked item (ignored here, with changes kept on this device) is not local work: a pull
    /// replaces what it holds.
    case parkedItemOverwritten = "parked-item-overwritten"
    /// A remote item whose name a local-only item (FIFO, socket, device node) holds here waits
    /// for the name, like one whose name an item not uploaded yet holds (`ContainerFS.nameBeside`).
    case remoteWaitsBehindLocalOnly = "remote-waits-behind-local-only"
    /// A server state of one name of a file hard-linked here is shown on the shared inode, as if
    /// the file had that name alone (`ContainerFS.splitOff` skipped): the other names take its
    /// place, content and attributes.
    case linkedNameShownInPlace = "linked-name-shown-in-place"
    /// A remote state planned before a rename or move made here (or shown while its notice is on
    /// its way to the engine) moves the item back to the server's place: the local rename is lost.
    case pullUndoesLocalMove = "pull-undoes-local-move"
    /// A commit with no base of an item the server has takes no ancestor: its place and mode
    /// overwrite the current ones (`CommitEngine.ancestor`), so a device that lost the record of
    /// its own rename moves the item back everywhere.
    case baselessCommitMovesBack = "baseless-commit-moves-back"
    /// The server takes a commit's `extra` whole when the committer changed it: two devices that
    /// set different attributes of one item keep only the last one's (`ExtraMerge`).
    case extraReplacedWhole = "extra-replaced-whole"
    /// A remote state replaces the item's user attributes although they changed here and the
    /// engine has not heard of it yet (`XattrRules.shown`): the local `setxattr` is lost.
    case pullOverwritesUnnoticedXattrs = "pull-overwrites-unnoticed-xattrs"
    /// A remote state whose attributes meet a change of them made here shows none of them
    /// (`XattrRules.shown`), while the item's base moves to it: the next commit sends the
    /// attributes set elsewhere as removed (or set back) and the server drops them.
    case xattrsKeptWholeBesideChange = "xattrs-kept-whole-beside-change"
    /// A create whose answer was lost holds no name in the index of which item the server has
    /// where (`ItemTable.Place`): the item is deleted or moved here, a new one takes its name and
    /// is pushed first, and the server puts the new one beside it.
    case unansweredCreateHoldsNoName = "unanswered-create-holds-no-name"
    /// A commit's answer whose attributes the server merged with others set elsewhere is only
    /// recorded, not shown (`SyncItem.planSettle`): this device never shows those others.
    case settleDropsMergedXattrs = "settle-drops-merged-xattrs"
    /// A commit sends the base's attributes, not the item's here (`XattrRules.draftExtra`).
    case xattrsStayLocal = "xattrs-stay-local"
    /// The move that puts a remote item beside a local-only item here is an ordinary rename: it
    /// undoes a rename of the item made meanwhile elsewhere (`CommitRequest.placeIfUnmoved`).
    case besideMoveOverridesRename = "beside-move-overrides-rename"
    /// A push whose state is its base's sends nothing although an earlier commit of the item
    /// may have applied without its answer (`UploadState.unanswered`): an attribute set and then
    /// removed here while that commit's answer was lost stays set everywhere.
    case nothingToSendAfterLostAnswer = "nothing-to-send-after-lost-answer"
    /// A commit whose base is older than versions only its own device made since (their answers
    /// were lost) is merged against that base as if another device had made them
    /// (`CommitEngine.apply`): what it undid of its own lost commit is not seen as its change, an
    /// edit conflicts with its own earlier one, and a delete is ignored.
    case ownVersionsMergedAsOthers = "own-versions-merged-as-others"
    /// The engine's index of which item the server has at each name keeps one item per name:
    /// the last one heard of there takes it, and when that one leaves, the name counts as free
    /// although another item is still there (`ItemTable.holder(of:)`); a new item is committed at
    /// the name before that one's move away, and the server puts it beside it.
    case placeHeldByTheLastCome = "place-held-by-the-last-come"
    /// An item pushed first to free a name goes before a folder it moved into that the server
    /// does not have yet (`CommitPlan.pushOrder`): the server refuses its move
    /// (`parent_not_found`) and the item taking its name, sent behind it, is put beside it.
    case holderBeforeItsFolder = "holder-before-its-folder"
    /// A commit is sent without its base version.
    case commitWithoutBase = "commit-without-base"
    /// A commit's answer is shown over a rename made here since (settle without relocating).
    case settleWithoutRelocate = "settle-without-relocate"
    /// A state the server refused as it is (`invalid_name`, …) is retried like server trouble
    /// (`UploadFailure.of`).
    case retryRefusedForever = "retry-refused-forever"
    /// A remote state that could not be shown leaves no mark for the next start's relist.
    case forgetHeldAcrossCrash = "forget-held-across-crash"
    /// Eviction drops a file with changes not uploaded yet (`SyncItem.evictable`).
    case evictUnsentWrites = "evict-unsent-writes"
    /// A write kept over a delete made elsewhere loses its "downloaded" marks, so a placeholder
    /// overwritten during the commit sends its old chunks.
    case forgetPresenceOnKeep = "forget-presence-on-keep"
    /// A live state older than a delete shown here is shown (a listing answered after the delete).
    case resurrectFromStaleListing = "resurrect-from-stale-listing"
    /// An older state of an item takes the place of a newer one waiting to be shown.
    case olderOverWaiting = "older-over-waiting"
    /// A folder's delete goes while an item the server has below it is still to be pushed
    /// (moved out here).
    case folderDeleteBeforeMovesOut = "folder-delete-before-moves-out"
    /// An item is committed at a name the server has another item of this device at, which was
    /// moved away or deleted here, before that item's push (`CommitPlan.nameFirst`): the server
    /// finds the name taken and puts the item beside it (`NAME 2`).
    case nameTakenBeforeItIsLeft = "name-taken-before-it-is-left"
    /// A first commit's answer that cannot be shown here is kept as the item's base although it
    /// holds another content than the one sent (a create sent again after its answer was lost,
    /// answered with another device's edit): the bytes here count as that edit, the edit is
    /// never shown (its size stays the old one) and a write here goes on it unseen.
    case answerKeptOverOtherBytes = "answer-kept-over-other-bytes"
    /// At start, a content change queued before the stop leaves a placeholder's base as it
    /// was: the file's bytes, written here, count as not downloaded.
    case forgetWholeAfterCrash = "forget-whole-after-crash"
    /// A change's upload-queue entry is queued when the engine hears of the change, not right
    /// behind the change: a commit in between saves the change without its entry.
    case queueEntryAtNotice = "queue-entry-at-notice"
    /// After an unclean stop, the files pushed once to find bytes whose change was never
    /// recorded are queued in memory only: a stop before their push forgets them.
    case recheckInMemoryOnly = "recheck-in-memory-only"
    /// A push decides on a file whose content change has not reached the engine yet.
    case pushBeforeNotice = "push-before-notice"
    /// An editor's save takes the document's identity while the store cannot commit (a full
    /// disk): its content files are exchanged on disk, its rows only in the queue.
    case transferIdentityWhileUnsaved = "transfer-identity-while-unsaved"
    /// An item shown again under its id (a restore, a delete undone by another device's edit)
    /// before its old cache file was moved to the trash does not finish that move first: the
    /// move owed takes the new node's file.
    case newNodeTakesRetiredFile = "new-node-takes-retired-file"

    /// An open with `O_TRUNC` queues no upload entry: the content change rests on the close,
    /// which reports nothing when a remote state was shown meanwhile.
    case truncatingOpenUnqueued = "truncating-open-unqueued"

    /// A big file's content is chunked and uploaded in the queue, holding back every item after it.
    case bigContentInQueue = "big-content-in-queue"

    /// After an unclean stop, a placeholder written here (its size is not its version's) stays a
    /// placeholder.
    case placeholderSizeAfterCrash = "placeholder-size-after-crash"

    /// A file deleted here while its commit was on its way is deleted on the answer although
    /// the answer holds content from elsewhere (a create sent again after its first answer was
    /// lost, onto an item another device edited meanwhile).
    case deleteOnForeignAnswer = "delete-on-foreign-answer"

    /// A delete of an item the server no longer has (purged from Recently Deleted) is retried
    /// instead of being done.
    case deleteOfPurgedRetried = "delete-of-purged-retried"

    /// A change inside a folder purged from Recently Deleted is refused (`parent_not_found`)
    /// instead of going to the top of the container (the server's `CommitEngine.place`).
    case changeInPurgedFolderRefused = "change-in-purged-folder-refused"

    /// An item the server no longer has (purged from Recently Deleted) stays here: a relist or a
    /// retry of a kept folder's delete waits for a state of it that never comes.
    case purgedItemStays = "purged-item-stays"

    /// An item the tree no longer holds (a folder delete took it after the server had moved it
    /// out) is shown again with the bytes its base says were downloaded: they went with it.
    case showAbsentAsDownloaded = "show-absent-as-downloaded"

    /// The cache keeper evicts a file whose change has not reached the engine yet (a save
    /// renamed over it a moment ago): its new bytes become holes before they are uploaded.
    case evictUnnoticedChange = "evict-unnoticed-change"

    /// A relist that could not ask about an item the listing lacks (the network went, the
    /// server was busy) ends without it: the item stays here for good.
    case relistDropsUnanswered = "relist-drops-unanswered"

    /// An item the server answered it has no more is deleted here although a newer state of it
    /// was shown meanwhile (this device's own commit brought it back after the answer).
    case purgeOverNewerState = "purge-over-newer-state"

    /// This mutation is the one the run breaks.
    public var isOn: Bool {
        #if DEBUG
        Self.active == self
        #else
        false
        #endif
    }

    #if DEBUG
    /// The mutation `NIMBUS_MUTATE` names (read once); nil for every ordinary run.
    public static let active: Mutation? = ProcessInfo.processInfo.environment["NIMBUS_MUTATE"].flatMap(Mutation.init(rawValue:))
    #endif
}
