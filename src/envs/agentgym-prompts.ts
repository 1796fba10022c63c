/** AgentGym's instruction turns, copied verbatim from its clients (agentenv/agentenv/envs/<env>.py at
 *  commit 3ef9235, the ReAct format where a client offers several): the first user message of every
 *  episode and the assistant's acknowledgement after it, as AgentGym's own rollouts and trajectories
 *  (AgentTraj) have them. The environment's first observation follows as the next user message.
 *  Data only; families.ts says which environment uses which. */

export const AGENTGYM_INSTRUCTIONS: Record<string, { instruction: string; ack: string }> = {
  textcraft: {
    ack: "OK. I'll follow your instructions and try my best to solve the task.",
    instruction:
      "You are given few useful crafting recipes to craft items in Minecraft. Crafting commands are of " +
      'the format "craft [target object] using [input ingredients]".\nEvery round I will give you an ' +
      'observation, you have to respond an action based on the state and instruction. You can "get" an ' +
      "object (ingredients) from the inventory or the environment, look-up the game inventory by " +
      '"inventory", or "craft" (target) using any of the crafting commands.\nYour output must ' +
      'strictly follow this format:"Thought:\nyour thoughts.\n\nAction:\nyour next ' +
      'action"\n\nReminder: \n1. Always specify the quantity when using "get" and "craft" commands. ' +
      "- Example of get: get 1 lapis lazuli - Example1 of craft: craft 1 blue dye using 1 lapis lazuli - " +
      'Example2 of craft: craft 1 golden carrot using 8 gold nugget, 1 carrot\n2. When using "get" ' +
      "command, do not specify whether the item comes from the inventory or the environment.\n3. You can " +
      "use ONLY crafting commands provided, do not use your own crafting commands. However, if the " +
      'crafting command uses a generic ingredient like "planks", you can use special types of the same ' +
      'ingredient e.g. "dark oak planks" in the command instead.\n\n',
  },
  babyai: {
    ack: "OK. I'll follow your instructions and try my best to solve the task.",
    instruction:
      "You are an exploration master that wants to finish every goal you are given. Every round I will " +
      "give you an observation, and you have to respond an action and your thought based on the " +
      "observation to finish the given task. You are placed in a room and you need to accomplish the given " +
      "goal with actions.\n\nYou can use the following actions: \n\n- turn right \n\n- turn left \n\n- " +
      "move forward \n\n- go to <obj> <id> \n\n- pick up <obj> <id> \n\n- go through <door> <id>: <door> " +
      "must be an open door. \n\n- toggle and go through <door> <id>: <door> can be a closed door or a " +
      "locked door. If you want to open a locked door, you need to carry a key that is of the same color " +
      "as the locked door. \n\n- toggle: there is a closed or locked door right in front of you and you " +
      "can toggle it.\nYour response should use the following format:\nThought:\n<Your " +
      "Thought>\n\nAction:\n<Your Action>",
  },
  sciworld: {
    ack: "OK. I'll follow your instructions and try my best to solve the task.",
    instruction:
      "You are an agent for science world. Every round I will give you an observation, you have to " +
      "respond an action based on the observation to finish the given task. Here are the actions you may " +
      'take: [{"action": "open/close OBJ", "description": "open/close a container"}, ' +
      '{"action": "de/activate OBJ", "description": "activate/deactivate a device"}, ' +
      '{"action": "connect OBJ to OBJ", "description": "connect electrical components"}, ' +
      '{"action": "disconnect OBJ", "description": "disconnect electrical components"}, ' +
      '{"action": "use OBJ [on OBJ]", "description": "use a device/item"}, {"action": "look ' +
      'around", "description": "describe the current room"}, {"action": "look at OBJ", ' +
      '"description": "describe an object in detail"}, {"action": "look in OBJ", ' +
      '"description": "describe a container\'s contents"}, {"action": "read OBJ", ' +
      '"description": "read a note or book"}, {"action": "move OBJ to OBJ", "description": ' +
      '"move an object to a container"}, {"action": "pick up OBJ", "description": "move an ' +
      'object to the inventory"}, {"action": "put down OBJ", "description": "drop an inventory ' +
      'item"}, {"action": "pour OBJ into OBJ", "description": "pour a liquid into a ' +
      'container"}, {"action": "dunk OBJ into OBJ", "description": "dunk a container into a ' +
      'liquid"}, {"action": "mix OBJ", "description": "chemically mix a container"}, ' +
      '{"action": "go to LOC", "description": "move to a new location"}, {"action": "eat ' +
      'OBJ", "description": "eat a food"}, {"action": "flush OBJ", "description": "flush a ' +
      'toilet"}, {"action": "focus on OBJ", "description": "signal intent on a task object"}, ' +
      '{"action": "wait", "description": "take no action for 10 iterations"}, {"action": ' +
      '"wait1", "description": "take no action for 1 iteration"}, {"action":"examine ' +
      'OBJ","description":"provides a description of the objects present on or in a receptacle."}, ' +
      '{"action": "task", "description": "describe current task"}, {"action": "inventory", ' +
      '"description": "list your inventory"}]\nYour response should use the following ' +
      "format:\nThought:\nyour thoughts.\n\nAction:\nyour next action",
  },
  alfworld: {
    ack: "OK. I'll follow your instructions and try my best to solve the task.",
    instruction:
      "Interact with a household to solve a task. Imagine you are an intelligent agent in a household " +
      "environment and your target is to perform actions to complete the task goal. At the beginning of " +
      "your interactions, you will be given the detailed description of the current environment and your " +
      "goal to accomplish. For each of your turn, you will be given a list of actions which you can " +
      'choose one to perform in this turn. You should choose from two actions: "THOUGHT" or ' +
      '"ACTION". If you choose "THOUGHT", you should first think about the current condition and ' +
      "plan for your future actions, and then output your action in this turn. Your output must strictly " +
      'follow this format:"Thought:\nyour thoughts.\n\nAction:\nyour next action"; If you choose ' +
      '"ACTION", you should directly output the action in this turn. Your output must strictly follow ' +
      'this format:"Action:\nyour next action". After your each turn, the environment will give you ' +
      "immediate feedback based on which you plan your next few steps. if the envrionment output " +
      '"Nothing happened", that means the previous action is invalid and you should try more ' +
      "options.\n Reminder: \n1. the action must be chosen from the given available actions. Any actions " +
      "except provided available actions will be regarded as illegal. \n2. Think when necessary, try to " +
      "act directly more in the process.",
  },
  webshop: {
    ack: "Ok.",
    instruction:
      "You are web shopping.\nI will give you instructions about what to do.\nYou have to follow the " +
      "instructions.\nEvery round I will give you an observation and a list of available actions, you have " +
      "to respond an action based on the state and instruction.\nYou can use search action if search is " +
      "available.\nYou can click one of the buttons in clickables.\nAn action should be of the following " +
      "structure:\nsearch[keywords]\nclick[value]\nIf the action is not valid, perform nothing.\nKeywords " +
      "in search are up to you, but the value in click must be a value in the list of available " +
      "actions.\nRemember that your keywords in search should be carefully designed.\nYour response should " +
      "use the following format:\n\nThought:\nI think ... \n\nAction: \nclick[something]",
  },
  sqlgym: {
    ack: "Ok.",
    instruction:
      "Given you a description of a SQlite database system, I will ask you a question, then you should " +
      "help me operate the SQLite database with SQL to answer the question.\n\nYou have to explain the " +
      "problem and your solution to me and write down your thoughts.\nAfter thinking and explaining " +
      "thoroughly, you should give a SQL statement to solve the question.\n\nyour response should be like " +
      "this:\nThought: Your thought here.\n\nAction: ```sql\nSELECT * FROM table WHERE " +
      "condition;\n```\n\nYou MUST put SQL in markdown format without any other comments. Your SQL should " +
      "be in one line. Every time you can only execute one SQL statement.",
  },
};
