package client

// OpenStreams is how many of the Client's shared Produce streams are open.
func (c *Client) OpenStreams() int {
	n := 0
	c.streams.m.Range(func(_, v any) bool {
		slot := v.(*streamSlot)
		slot.mu.Lock()
		if slot.ps != nil && !slot.ps.isBroken() {
			n++
		}
		slot.mu.Unlock()
		return true
	})
	return n
}
