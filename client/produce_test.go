package client_test

import (
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestProducerAcrossGroupsAndLeaderLoss runs the shared leader-loss
// scenario (harness.ProduceLeaderLoss) with a Producer that reaches a real
// three-node cluster of two shards directly.
func TestProducerAcrossGroupsAndLeaderLoss(t *testing.T) {
	hc := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2})
	hc.WaitReady()
	c := mustDial(t, strings.Join(hc.Endpoints(), ","))
	harness.ProduceLeaderLoss(ctxFor(t, 90*time.Second), t, hc, c.NewProducer(client.WithInflight(32)), c, "p", 600)
}
