"""Models: LeNet-5 (models.lenet), GPT-2 (models.gpt), and the activation registry."""
