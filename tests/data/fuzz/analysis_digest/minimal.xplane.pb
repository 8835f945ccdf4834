
*	/host:CPUmain"è"step"h