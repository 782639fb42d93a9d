package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestProducerThroughProxy runs the shared leader-loss scenario
// (harness.ProduceLeaderLoss) with a Producer whose client knows only the
// proxy: the proxy relays each item over its own streams to the leaders
// and retries the items of the killed one with their request ids.
func TestProducerThroughProxy(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	pc := dial(t, p.Addr(), client.WithProxyOnly())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	harness.ProduceLeaderLoss(ctx, t, c, pc.NewProducer(client.WithInflight(32)), dial(t, strings.Join(c.Endpoints(), ",")), "pp", 400)
}
