// Package graph is ovlkit's layer store: image layers (Create) and
// container layers (CreateReadWrite) stacked on overlayfs, mounted with
// reference counts, filled from and exported to OCI tar layers.
//
// A store lives in one home directory:
//
//	state.log         the layers and their parents (the truth): a log of
//	                  snapshots, the last intact one counting (state.json
//	                  before; Open renames it)
//	layers/<id>       its xattr trusted.ovlkit.mounts holds the mount count
//	lock              serialises state changes between processes (flock)
//	features.json     kernel features probed for this boot
//	refs              references to diff directories handed out this
//	                  boot, mapped by every process (see refTable)
//	layers/<id>/      diff/ (the layer's own changes), work/, merged/, and
//	                  root/ for image layers of the hardlink layout
//	l/<link>          short names of the diffs, so 500 lowers fit one page
//	empty/            the lower of a layer without parent
//	staging/          layers being built; made visible by one rename
//
// The home and every directory the store keeps in it are 0700 (see
// ownerOnly), and read-only views are mounted nosuid,nodev.
//
// Two layouts exist. "overlay" keeps only each layer's own diff and stacks
// all ancestors as lower layers. "hardlink" is the 2014 design: an image
// layer is a full tree made by hard-linking its parent's tree and applying
// the tar, and a container layer is an overlay on that single tree.
package graph

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ovlkit/ovlkit/layer"
	"github.com/ovlkit/ovlkit/ovl"
	"golang.org/x/sys/unix"
)

// SyncPolicy says what is flushed before a layer becomes visible.
type SyncPolicy string

// Sync policies.
const (
	// SyncFsync makes a new layer durable before the rename that makes
	// it visible (Create fsyncs each file and directory it builds,
	// ApplyDiff syncs the filesystem once with syncfs), and syncs the
	// state file: a completed ApplyDiff survives power loss.
	SyncFsync SyncPolicy = "fsync"
	// SyncNone leaves flushing to the kernel: faster, and after a crash a
	// completed layer may come back incomplete or empty.
	SyncNone SyncPolicy = "none"
)

// Errors callers can test with errors.Is.
var (
	ErrNotExist    = fmt.Errorf("layer does not exist: %w", fs.ErrNotExist)
	ErrExist       = fmt.Errorf("layer already exists: %w", fs.ErrExist)
	ErrNoStore     = errors.New("not a layer store (run init)")
	ErrHasChildren = errors.New("layer has children")
	ErrMounted     = errors.New("layer is mounted")
	ErrNotMounted  = errors.New("layer is not mounted")
	ErrTooDeep     = errors.New("layer chain too deep for overlayfs")
	ErrNotEmpty    = errors.New("layer already has content")
	ErrInvalidID   = errors.New("invalid layer id")
	ErrUnfitFS     = errors.New("this filesystem cannot hold overlay layers")
	// ErrVolatileLost: the layer was mounted volatile before a reboot and
	// may have lost writes; remove it.
	ErrVolatileLost = errors.New("layer was mounted volatile before a reboot and may be torn")
)

// validID keeps IDs usable as one path component and short enough for the
// mount-data budget (see maxDataPerLayer): 1-128 of A-Z a-z 0-9 _ . -, not
// starting with _ . - (^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$). Every
// operation on a layer checks its ID first, so this is a loop, not a
// regular expression, which cost more than the rest of a Get that finds
// the layer mounted.
func validID(id string) error {
	ok := len(id) >= 1 && len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		ok = alnum || i > 0 && (c == '_' || c == '.' || c == '-')
	}
	if !ok {
		return fmt.Errorf("%q: %w (1-128 of A-Z a-z 0-9 _ . -, not starting with _ . -)", id, ErrInvalidID)
	}
	return nil
}

// Options configure Open.
type Options struct {
	// Layout of a store created by this Open; for an existing store it
	// must be empty or match.
	Layout Layout
	// Create makes the store when home has none.
	Create bool
	// Sync is the durability policy; empty means SyncFsync.
	Sync SyncPolicy
	// FsyncStrict mounts layers with fsync=strict; Open fails when the
	// kernel does not offer it.
	FsyncStrict bool
	// Volatile mounts container layers with the overlay "volatile" option:
	// overlayfs skips every sync of the upper (fsync, syncfs and the one
	// at unmount). A crash can then tear the layer, so after a reboot the
	// store refuses to mount a layer that was mounted volatile
	// (ErrVolatileLost); within one boot it remounts with its data.
	Volatile bool
	// Userxattr makes a store created by this Open keep overlay metadata
	// in user.overlay.* xattrs and mount with userxattr, the form an
	// unprivileged overlay reads. Fixed at creation; for an existing store
	// it must match or be false.
	Userxattr bool
	// StrictUpper says whether mounts carry the series' strict_upper
	// option: FeatureAuto (the default) where the kernel has it,
	// FeatureOn requires it (Open fails without), FeatureOff never.
	StrictUpper FeatureUse
	// MountOptions are overlay options added to every mount of the
	// store, read-only ones included, after the store's own: for
	// instance redirect_dir=on, so that a directory of a lower layer can
	// be renamed in a container. Options the store sets itself (lowerdir,
	// upperdir, workdir, index, userxattr, volatile, fsync, strict_upper)
	// are refused; use the fields above.
	MountOptions []string
	// Features replaces the probe, for callers that already probed this
	// filesystem (the probe mounts, so it needs root).
	Features *ovl.Features
	// Limits bound what one ApplyDiff may cost: total size, entries, path
	// depth and the zstd decoder window. A zero field takes the default
	// of layer.DefaultLimits, a negative one turns the limit off. A layer
	// that reaches one is refused with an error wrapping the limit's
	// sentinel (layer.ErrTooLarge, ErrTooManyEntries, ErrTooDeep,
	// ErrDecoderWindow) and leaves the layer as it was.
	Limits layer.Limits
	// Logger receives a warning for each best-effort cleanup that fails:
	// an undo after an error, a leftover recovery removes, a lock release.
	// Their failures never change the result of a call (what they leave
	// behind is reclaimed by the next Open), so they are reported here
	// rather than returned. Nil discards them.
	Logger *slog.Logger
}

// logger is opts.Logger, or one that discards.
func (o *Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// logCleanup reports a best-effort cleanup that failed; err nil is
// success and says nothing.
func logCleanup(log *slog.Logger, what string, err error) {
	if err != nil {
		log.Warn("graph: cleanup failed", "step", what, "err", err)
	}
}

// Store is an open layer store. Its methods are safe for concurrent use by
// many goroutines and, through the lock file, by several processes.
type Store struct {
	home     string
	layout   diskLayout
	userx    bool
	sync     SyncPolicy
	feat     ovl.Features
	mounter  ovl.Mounter
	extraOpt []string // options of writable mounts besides the base ones
	userOpt  []string // Options.MountOptions, on every mount
	strict   bool     // mounts carry strict_upper
	volatile bool
	boot     string // this boot's ID, for volatile mounts
	bootTag  string // a digest of it, for references to diff directories
	limits   layer.Limits
	log      *slog.Logger

	mu    sync.Mutex // guards lock holders within this process
	lockF *os.File
	state stateFile
	// layerFds keeps the descriptors of layer directories that exclusive
	// layer locks were taken on, open between locks (see layerFdCache).
	layerFds layerFdCache
	// refs counts the references to diff directories (see refTable);
	// nil where Get never hands one out.
	refs *refTable
	// planned are the layers whose diff directory this process last
	// handed out after planning a Get, with their slot and the
	// generation it had then: while that is unchanged, Get and Put of
	// the layer are one operation on the slot (see getPlanned).
	planned plannedRefs
}

// LayerMounter is the part of the store a runtime needs to use layers.
// It is the driver-style interface without contexts; Store.Background
// returns one.
type LayerMounter interface {
	Get(id string) (string, error)
	Put(id string) error
}

// Background adapts the store to LayerMounter: Get and Put with
// context.Background(), so they wait on locks for as long as it takes.
func (s *Store) Background() LayerMounter { return backgroundMounter{s} }

type backgroundMounter struct{ s *Store }

func (b backgroundMounter) Get(id string) (string, error) { return b.s.Get(context.Background(), id) }
func (b backgroundMounter) Put(id string) error           { return b.s.Put(context.Background(), id) }

// Open opens the store in home, creating it when opts.Create is set.
// Opening finishes or undoes what a crashed process left: staged layers
// are removed, layer directories without a state record are removed, lost
// short links are made again and stale mount counts are reset.
func Open(home string, opts Options) (*Store, error) {
	home, err := filepath.Abs(home)
	if err != nil {
		return nil, fmt.Errorf("store home: %w", err)
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	log := opts.logger()
	statePath := filepath.Join(home, stateName)
	if err := migrateStateName(home, opts.Sync == SyncFsync); err != nil {
		return nil, err
	}
	nh, err := locateStore(home, statePath, opts.Create)
	if err != nil {
		return nil, err
	}
	if err := makeStoreDirs(home); err != nil {
		nh.undo(home, log)
		return nil, err
	}
	lf, err := os.OpenFile(filepath.Join(home, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store lock: %w", err)
	}
	s := &Store{
		home:   home,
		sync:   opts.Sync,
		limits: opts.Limits,
		log:    log,
		lockF:  lf,
		state:  stateFile{path: statePath, sync: opts.Sync == SyncFsync, log: log},
	}
	if err := s.init(opts); err != nil {
		logCleanup(log, "close store lock", lf.Close())
		s.state.close()
		if s.refs != nil {
			logCleanup(log, "close reference table", s.refs.close())
		}
		// A store refused at creation leaves nothing behind.
		nh.undo(home, log)
		return nil, err
	}
	return s, nil
}

// check fills in the default sync policy and refuses unknown values.
func (o *Options) check() error {
	if o.Sync == "" {
		o.Sync = SyncFsync
	}
	if o.Sync != SyncFsync && o.Sync != SyncNone {
		return fmt.Errorf("unknown sync policy %q", o.Sync)
	}
	switch o.StrictUpper {
	case FeatureAuto, FeatureOn, FeatureOff:
	default:
		return fmt.Errorf("unknown strict_upper setting %q (want on, off or empty for auto)", o.StrictUpper)
	}
	for _, m := range o.MountOptions {
		if err := checkMountOption(m); err != nil {
			return err
		}
	}
	if o.Layout != "" {
		return o.Layout.Valid()
	}
	return nil
}

// FeatureUse says whether the store uses a kernel feature.
type FeatureUse string

// Feature settings.
const (
	FeatureAuto FeatureUse = ""    // where the kernel has it
	FeatureOn   FeatureUse = "on"  // required: Open fails without it
	FeatureOff  FeatureUse = "off" // never
)

// ownOptions are the overlay options the store decides itself.
var ownOptions = map[string]bool{"lowerdir": true, "upperdir": true, "workdir": true, "index": true,
	"userxattr": true, "volatile": true, "fsync": true, "strict_upper": true}

// checkMountOption refuses an extra mount option that is malformed or one
// the store sets itself.
func checkMountOption(o string) error {
	if o == "" || strings.ContainsAny(o, ", \t\n") {
		return fmt.Errorf("invalid extra mount option %q", o)
	}
	key, _, _ := strings.Cut(o, "=")
	if ownOptions[key] || key == "lowerdir+" || key == "datadir+" {
		return fmt.Errorf("extra mount option %q: the store sets %s itself", o, key)
	}
	return nil
}

// newHome says whether Open is creating the store, and what it must give
// back if it refuses the new store.
type newHome struct {
	fresh   bool   // no store was there
	existed bool   // the home directory was there
	mode    uint32 // and had this mode
}

// locateStore finds the store's state at statePath, or, with create, makes
// sure a new store may be made in home.
func locateStore(home, statePath string, create bool) (newHome, error) {
	nh := newHome{existed: true}
	_, err := os.Stat(statePath)
	if err == nil {
		return nh, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nh, fmt.Errorf("open store: %w", err)
	}
	if !create {
		return nh, fmt.Errorf("%s: %w", home, ErrNoStore)
	}
	if err := checkBackingFS(home); err != nil {
		return nh, err
	}
	nh.fresh = true
	if _, err := os.Lstat(home); errors.Is(err, fs.ErrNotExist) {
		nh.existed = false
		return nh, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil {
		return nh, fmt.Errorf("store home: %w", err)
	}
	nh.mode = st.Mode & 0o7777
	return nh, nil
}

// makeStoreDirs makes the home and the directories the store keeps in it,
// and restricts them to the owner.
func makeStoreDirs(home string) error {
	if err := os.MkdirAll(home, ownerOnly); err != nil {
		return fmt.Errorf("create store home: %w", err)
	}
	for _, d := range []string{"layers", "l", "staging", "empty"} {
		if err := os.MkdirAll(filepath.Join(home, d), ownerOnly); err != nil {
			return fmt.Errorf("create store: %w", err)
		}
	}
	// Nobody but the owner may reach a layer (see ownerOnly); a store
	// from before is locked down here, l/ once recovery has made sure it
	// is a directory, and the layer directories there too.
	for _, d := range []string{home, filepath.Join(home, "layers"), filepath.Join(home, "staging"), filepath.Join(home, "empty")} {
		if err := restrictDir(d); err != nil {
			return fmt.Errorf("open store: %w", err)
		}
	}
	return nil
}

// undo removes what a refused Open made in home, and home itself when
// Open made it; a home that existed gets its mode back. A store that was
// there already is left alone.
func (nh newHome) undo(home string, log *slog.Logger) {
	if !nh.fresh {
		return
	}
	if !nh.existed {
		logCleanup(log, "remove refused store", os.RemoveAll(home))
		return
	}
	for _, n := range []string{"layers", "l", "staging", "empty", "lock", stateName, "features.json", refsName} {
		logCleanup(log, "remove refused store", os.RemoveAll(filepath.Join(home, n)))
	}
	logCleanup(log, "restore home mode", unix.Chmod(home, nh.mode))
}

func (s *Store) init(opts Options) error {
	unlock, err := s.lock(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	st, err := s.loadOrCreate(opts)
	if err != nil {
		return err
	}
	if s.layout, err = layoutOf(st.Layout); err != nil {
		return err
	}
	s.userx = st.Userxattr
	if err := s.probeFeatures(opts); err != nil {
		return err
	}
	if err := s.chooseOptions(opts); err != nil {
		return err
	}
	if err := s.openRefs(); err != nil {
		return err
	}
	return s.recover(st)
}

// loadOrCreate reads the store's state, or makes a new store's, and checks
// that it has the layout and xattr namespace opts ask for.
func (s *Store) loadOrCreate(opts Options) (*state, error) {
	st, err := s.state.load()
	if errors.Is(err, ErrNoStore) {
		layout := opts.Layout
		if layout == "" {
			layout = LayoutOverlay
		}
		st = newState(layout, time.Now().UTC())
		st.Userxattr = opts.Userxattr
		if err := s.state.store(st); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if opts.Layout != "" && opts.Layout != st.Layout {
		return nil, fmt.Errorf("store %s has layout %s, not %s", s.home, st.Layout, opts.Layout)
	}
	if opts.Userxattr && !st.Userxattr {
		return nil, fmt.Errorf("store %s keeps overlay xattrs in trusted.overlay.*, not user.overlay.*", s.home)
	}
	return st, nil
}

// probeFeatures takes the kernel's and the backing filesystem's features
// (opts.Features, or the store's probe) and refuses a store they cannot
// hold.
func (s *Store) probeFeatures(opts Options) error {
	if opts.Features != nil {
		s.feat = *opts.Features
	} else {
		f, err := loadFeatures(s.home)
		if err != nil {
			return err
		}
		s.feat = f
	}
	if err := s.feat.Usable(); err != nil {
		return fmt.Errorf("store %s: %w: %w", s.home, err, ErrUnfitFS)
	}
	s.mounter = ovl.Mounter{LowerdirPlus: s.feat.NewMountAPI}
	if !s.userx && !s.feat.Xattrs {
		return fmt.Errorf("store %s: the backing filesystem does not store trusted.* xattrs, which hold opaque directories: %s: %w",
			s.home, s.feat.Notes["trusted_xattr"], ErrUnfitFS)
	}
	if s.userx {
		if !s.feat.Userxattr {
			return fmt.Errorf("store %s needs the userxattr mount option, which the kernel refused: %s", s.home, s.feat.Notes["userxattr"])
		}
		if err := userXattrsWork(s.home, s.log); err != nil {
			return fmt.Errorf("store %s: %w", s.home, err)
		}
		s.extraOpt = append(s.extraOpt, "userxattr")
	}
	return nil
}

// openRefs maps the reference table where Get hands out diff
// directories; every process of the store must use it or none, so a
// table this process cannot use fails Open.
func (s *Store) openRefs() error {
	if s.userx || s.bootTag == "" {
		return nil
	}
	t, err := openRefTable(s.home, s.bootTag)
	if err != nil {
		return fmt.Errorf("store %s: %w", s.home, err)
	}
	s.refs = t
	return nil
}

// chooseOptions sets the mount options opts ask for, refusing those the
// kernel does not offer.
func (s *Store) chooseOptions(opts Options) error {
	var err error
	if opts.Volatile && opts.FsyncStrict {
		return errors.New("options Volatile and FsyncStrict contradict each other")
	}
	// The boot ID dates volatile mounts and references to diff
	// directories (see direct); only the former cannot do without it.
	boot, err := bootID()
	if s.volatile = opts.Volatile; s.volatile && err != nil {
		return err
	}
	if err == nil {
		s.boot, s.bootTag = boot, bootTag(boot)
	}
	if opts.FsyncStrict {
		if !s.feat.FsyncStrict {
			return fmt.Errorf("fsync=strict requested but the kernel does not offer it: %s", s.feat.Notes["fsync_strict"])
		}
		s.extraOpt = append(s.extraOpt, "fsync=strict")
	}
	switch opts.StrictUpper {
	case FeatureOn:
		if !s.feat.StrictUpper {
			return fmt.Errorf("strict_upper requested but the kernel does not offer it: %s", s.feat.Notes["strict_upper"])
		}
		s.strict = true
	case FeatureAuto:
		s.strict = s.feat.StrictUpper
	}
	s.userOpt = append([]string(nil), opts.MountOptions...)
	s.extraOpt = append(s.extraOpt, s.userOpt...)
	return nil
}

// Close releases the store. Mounted layers stay mounted; see Cleanup.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lockF == nil {
		return nil
	}
	err := s.lockF.Close()
	s.lockF = nil
	s.state.close()
	s.layerFds.closeIdle(0)
	if err != nil {
		return fmt.Errorf("close store lock: %w", err)
	}
	if s.refs != nil {
		if err := s.refs.close(); err != nil {
			return fmt.Errorf("close reference table: %w", err)
		}
	}
	return nil
}

// Home is the store's directory.
func (s *Store) Home() string { return s.home }

// Layout is the store's layout.
func (s *Store) Layout() Layout { return s.layout.name() }

// Features are the kernel features the store uses.
func (s *Store) Features() ovl.Features { return s.feat }

// lock takes the store lock: the in-process mutex, then the flock that
// excludes other processes. Hold it only for short state transactions.
// Waiting for either ends when ctx is done (see acquire).
func (s *Store) lock(ctx context.Context) (func(), error) {
	err := acquire(ctx, func() (bool, error) { return s.mu.TryLock(), nil }, func() error { s.mu.Lock(); return nil })
	if err != nil {
		return nil, fmt.Errorf("lock store: %w", err)
	}
	if s.lockF == nil {
		s.mu.Unlock()
		return nil, errors.New("store is closed")
	}
	if err := flockCtx(ctx, int(s.lockF.Fd()), unix.LOCK_EX); err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("lock store: %w", err)
	}
	return func() {
		logCleanup(s.log, "unlock store", flock(int(s.lockF.Fd()), unix.LOCK_UN))
		s.mu.Unlock()
	}, nil
}

// update runs fn on the current state under the store lock and writes the
// state when fn reports a change. A failed fn or write discards fn's
// in-memory changes.
func (s *Store) update(ctx context.Context, fn func(st *state) (bool, error)) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := s.state.load()
	if err != nil {
		return err
	}
	changed, err := fn(st)
	if err != nil {
		s.state.invalidate()
		return err
	}
	if !changed {
		return nil
	}
	if err := s.state.store(st); err != nil {
		s.state.invalidate()
		return err
	}
	return nil
}

// peek runs fn on the state as this process last saw it when the state
// file shows that no process changed it since, which needs no store lock;
// otherwise it is view. fn must not change the state. It serves readers
// whose part of the state only changes under a layer lock they hold, and
// readers that hold no lock after the read (Diff), for which the state
// before a transaction that another process has not finished is as good
// as the state after it.
func (s *Store) peek(ctx context.Context, fn func(st *state) error) error {
	s.mu.Lock()
	if s.lockF != nil {
		if st := s.state.peek(); st != nil {
			defer s.mu.Unlock()
			return fn(st)
		}
	}
	s.mu.Unlock()
	return s.view(ctx, fn)
}

// view runs fn on the current state under the store lock; fn must not
// change it.
func (s *Store) view(ctx context.Context, fn func(st *state) error) error {
	return s.update(ctx, func(st *state) (bool, error) { return false, fn(st) })
}

func flock(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// flockCtx is flock that stops waiting when ctx is done.
func flockCtx(ctx context.Context, fd, how int) error {
	return acquire(ctx,
		func() (bool, error) {
			err := flock(fd, how|unix.LOCK_NB)
			if errors.Is(err, unix.EWOULDBLOCK) {
				return false, nil
			}
			return err == nil, err
		},
		func() error { return flock(fd, how) })
}

// acquire takes a lock: try takes it if it is free, wait blocks until it
// is. A done ctx fails at once, even with the lock free, so that a
// cancelled call starts nothing. A ctx that can be done polls try, from
// 1 ms to every 50 ms, and gives up with ctx's error; neither flock(2)
// nor sync.Mutex can be interrupted otherwise. A ctx that is never done
// blocks in wait, as an uncontended caller would.
func acquire(ctx context.Context, try func() (bool, error), wait func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx.Done() == nil {
		return wait()
	}
	delay := time.Millisecond
	for {
		ok, err := try()
		if ok || err != nil {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

func (s *Store) layerDir(id string) string   { return filepath.Join(s.home, "layers", id) }
func (s *Store) diffDir(id string) string    { return filepath.Join(s.home, "layers", id, "diff") }
func (s *Store) workDir(id string) string    { return filepath.Join(s.home, "layers", id, "work") }
func (s *Store) mergedDir(id string) string  { return filepath.Join(s.home, "layers", id, "merged") }
func (s *Store) rootDir(id string) string    { return filepath.Join(s.home, "layers", id, "root") }
func (s *Store) linkPath(link string) string { return s.home + "/l/" + link }
func (s *Store) emptyDir() string            { return filepath.Join(s.home, "empty") }
func (s *Store) whiteouts() layer.WhiteoutFormat {
	if s.userx {
		return layer.OverlayUserWhiteouts
	}
	return layer.OverlayWhiteouts
}

// readOnlyOptions are the options of a mount without upper: those of
// every mount but fsync=, which is about copy-up, which such a mount never
// does.
func (s *Store) readOnlyOptions() []string {
	o := s.baseOptions()
	if s.userx {
		o = append(o, "userxattr")
	}
	return append(o, s.userOpt...)
}

// baseOptions are the kernel's base options (see ovl.Features.BaseOptions)
// as Options.StrictUpper chose.
func (s *Store) baseOptions() []string {
	var o []string
	for _, b := range s.feat.BaseOptions() {
		if b == "strict_upper" && !s.strict {
			continue
		}
		o = append(o, b)
	}
	return o
}

// userXattrsWork checks that the backing filesystem stores user.*
// xattrs, without which opaque directories would silently be lost
// (tmpfs before 6.6 has none).
func userXattrsWork(home string, log *slog.Logger) error {
	f, err := os.CreateTemp(filepath.Join(home, "staging"), "xattr-")
	if err != nil {
		return fmt.Errorf("user xattr check: %w", err)
	}
	name := f.Name()
	f.Close()
	defer func() { logCleanup(log, "remove xattr check file", os.Remove(name)) }()
	if err := unix.Lsetxattr(name, "user.ovlkit.check", []byte("y"), 0); err != nil {
		return fmt.Errorf("the backing filesystem does not store user xattrs, which userxattr layers need: %w", err)
	}
	return nil
}
