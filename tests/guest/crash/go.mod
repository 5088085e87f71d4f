module github.com/ovlkit/ovlkit/tests/guest/crash

go 1.26.8

replace github.com/ovlkit/ovlkit => ../../..

require (
	github.com/ovlkit/ovlkit v0.0.0-00010101000000-000000000000
	golang.org/x/sys v0.50.0
)
