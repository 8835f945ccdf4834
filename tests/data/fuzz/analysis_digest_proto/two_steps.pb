
worker-0€€èïÊœÃdÀùï €ã¾
(À–±0€ÚÄ	8À„=@€‰z#eÀùïà»  ğÄ
(À–±0 çÊ	8 ÷6@€‰z *events with a step_num stat22
'ncclDevKernel_AllReduce_Sum_f32_RING_LL €­â2

train_step  µş