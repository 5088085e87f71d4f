package graph

import "time"

var fixedTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
