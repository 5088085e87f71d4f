module github.com/ovlkit/ovlkit

go 1.26.8

require (
	github.com/euank/go-kmsg-parser v2.0.0+incompatible
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/hugelgupf/vmtest v0.0.0-20240307030256-5d9f3d34a58d
	github.com/klauspost/compress v1.18.0
	github.com/moby/sys/mountinfo v0.7.2
	github.com/prometheus/procfs v0.23.0
	github.com/u-root/gobusybox/src v0.0.0-20250101170133-2e884e4509c7
	github.com/u-root/mkuimage v0.0.0-20250905073043-9a40452f5d3b
	github.com/u-root/uio v0.0.0-20240224005618-d2acac8f3701
	golang.org/x/sys v0.50.0
)

require (
	github.com/Netflix/go-expect v0.0.0-20220104043353-73e0943537d2 // indirect
	github.com/creack/pty v1.1.24 // indirect
	github.com/hugelgupf/go-shlex v0.0.0-20200702092117-c80c9d0918fa // indirect
	github.com/klauspost/pgzip v1.2.6 // indirect
	github.com/pierrec/lz4/v4 v4.1.22 // indirect
	github.com/u-root/u-root v0.16.0 // indirect
	github.com/ulikunitz/xz v0.5.15 // indirect
	github.com/vishvananda/netlink v1.3.0 // indirect
	github.com/vishvananda/netns v0.0.4 // indirect
	golang.org/x/exp v0.0.0-20250305212735-054e65f0b394 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/tools v0.52.0 // indirect
	mvdan.cc/sh/v3 v3.11.0 // indirect
)

tool github.com/u-root/u-root/cmds/core/init
