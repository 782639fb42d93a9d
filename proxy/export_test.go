package proxy

// MaxWait is maxWait, for the test that keeps it equal to rpc.MaxWait.
const MaxWait = maxWait
