// Package experiments measures the claims made for overlayfs when CoreOS
// moved from Btrfs to it (2014): containers are created and destroyed
// faster, one copy of a file's pages in the page cache serves every
// container, and the price is copy-up on the first write to a lower file;
// plus the inode cost of the seed driver's hard-link layout.
//
// The four experiments are guest benchmarks (build tag ovlkit_guest) run
// in one boot of the patched kernel with ext4, xfs and btrfs disks by
// `make bench`. Each prints its samples as Record lines; the host side of
// this package (Parse, Summarize, Ratios) and cmd/benchplot turn them into
// tables, plots and a result file (Documentation/benchmarks.rst).
package experiments
