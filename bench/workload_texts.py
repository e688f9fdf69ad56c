"""The workloads' fixed texts: W1's support policy and conversations, W2's few-shot shots and
questions, W3's schema and products, W4's raw sentences (data only; `bench.workloads` builds
the `Workloads` from them)."""

from __future__ import annotations

SUPPORT_POLICY = """You are Nova, the customer support assistant of BrightHome, an online store \
that sells home electronics, kitchen appliances and furniture in the EU and the UK.

Follow these rules in every reply:
1. Be polite, brief and concrete. Answer in at most three sentences.
2. Never invent order details. If you need an order number, ask for it; order numbers look \
like BH- followed by eight digits.
3. Returns: most items can be returned within 30 days of delivery if unused and in the original \
packaging. Opened electronics can be returned within 14 days with a 10 percent restocking fee. \
Mattresses and personalised furniture cannot be returned.
4. Refunds go back to the original payment method within 5 to 7 business days after the \
warehouse receives the item.
5. Shipping: standard delivery takes 3 to 5 business days and is free above 50 euros; express \
delivery takes 1 to 2 business days and costs 9.90 euros.
6. Warranty: every product has a 2-year warranty. For a defect, collect the order number, a \
short description and a photo, then open a warranty case.
7. If the customer is angry, acknowledge the problem first, then offer the next concrete step.
8. Escalate to a human agent when the customer asks for one, when a refund above 500 euros is \
disputed, or when a safety issue (smoke, sparks, burns) is reported."""

CONVERSATIONS: list[list[str]] = [
    [
        (
            "Hi, I ordered a coffee grinder last week and it still has not arrived. The tracking page "
            "has said 'label created' for five days now."
        ),
        (
            "The order number is BH-20481173. I paid for express delivery, so I expected it two days "
            "after I ordered."
        ),
        (
            "Can you refund the express shipping fee at least? I do not think I should pay extra for "
            "a slower delivery."
        ),
        (
            "Fine. If the grinder does not arrive by Friday, can I cancel the whole order and get all "
            "of my money back?"
        ),
    ],
    [
        (
            "Hello! I want to return a bluetooth speaker I bought twelve days ago. I opened it but it "
            "just does not sound as good as I hoped."
        ),
        (
            "Ten percent restocking fee? That seems like a lot for something I used only twice. Is "
            "there no way around it?"
        ),
        "Alright, how do I actually send it back? Do I need to print a label or bring it to a shop?",
        (
            "And when exactly will I see the money back on my credit card after your warehouse "
            "receives the speaker?"
        ),
    ],
    [
        (
            "My new kettle started making a burning smell and some smoke came out of the base this "
            "morning. I unplugged it right away."
        ),
        (
            "No one was hurt, but I am scared to use it again. It is only three weeks old, model "
            "BrightBoil 2000."
        ),
        (
            "I would like to talk to a real person about this please, not a bot. This is a safety "
            "issue in my opinion."
        ),
        "Thank you. While I wait, should I keep the kettle or throw it away? I have the box still.",
    ],
    [
        (
            "Hey, do you deliver sofas to the UK? I am looking at the Oslo three-seater in grey and "
            "want to know how delivery works."
        ),
        (
            "How long would it take to arrive in Manchester, and will the driver carry it up to my "
            "flat on the third floor?"
        ),
        "If the sofa does not fit through my door, can I return it even though it is a large item?",
        (
            "Great, last question: is the 2-year warranty also valid for the fabric, like tears or "
            "stains?"
        ),
    ],
    [
        (
            "I am really annoyed. This is the second blender from you that broke within a month. The "
            "motor just stops after ten seconds."
        ),
        "Order BH-55120987. I do not want a third one of the same model, I want my money back.",
        (
            "The first one was replaced under warranty in March. Do I need to send photos again for "
            "the second one?"
        ),
        (
            "How long will the warranty case take? I need a blender for my kids' breakfast every "
            "morning."
        ),
    ],
    [
        (
            "Hi there, I bought a mattress for my guest room but it is much too firm. Can I exchange "
            "it for a softer model?"
        ),
        (
            "That is disappointing. It is still wrapped in plastic from the delivery, I only unrolled "
            "it to check. Does that not count as unused?"
        ),
        (
            "Okay, then could you at least tell me whether you sell mattress toppers that could make "
            "it softer?"
        ),
        (
            "What would the shipping cost be for a topper to Lyon, and would it come before the "
            "weekend?"
        ),
    ],
    [
        (
            "Good evening. I received a laptop stand but the box contained a monitor arm instead. "
            "The packing slip shows the right item."
        ),
        (
            "My order number is BH-73310452. I need the laptop stand for work on Monday, is there any "
            "way to get it quickly?"
        ),
        (
            "Do I have to pay for sending back the monitor arm, given that it was your mistake and "
            "not mine?"
        ),
        (
            "Perfect. Can you email me a confirmation of all this, so that I have it in writing in "
            "case something goes wrong later?"
        ),
    ],
    [
        (
            "Hello, my account page shows a refund of 89 euros as completed, but I still do not see "
            "it on my bank statement."
        ),
        (
            "The refund was marked complete on Tuesday. I paid with a debit card, if that makes any "
            "difference to the timing."
        ),
        (
            "Could you give me store credit instead, so that I can buy the replacement toaster "
            "today before the sale ends?"
        ),
        (
            "Never mind, I will wait for the bank. Can you tell me which payment methods you accept "
            "for the new order?"
        ),
    ],
]

# Five worked examples, then a question in the same format; the choices are the option texts.
FEW_SHOT_HEADER = (
    "The following are multiple choice questions about general knowledge. Read "
    "each question and its four options, then give the correct option. A short "
    "explanation follows each answer.\n\n"
)
SHOTS: list[tuple[str, list[str], str, str]] = [
    (
        "What is the largest planet in the Solar System?",
        ["Earth", "Jupiter", "Mars", "Venus"],
        "Jupiter",
        (
            "Jupiter is a gas giant whose mass is more than twice that of all the other "
            "planets combined. Its diameter is about eleven times that of the Earth, and its Great Red "
            "Spot is a storm larger than our whole planet."
        ),
    ),
    (
        "Which gas do plants absorb from the air for photosynthesis?",
        ["oxygen", "nitrogen", "carbon dioxide", "helium"],
        "carbon dioxide",
        (
            "Plants take in carbon dioxide through small pores in their leaves and, using the "
            "energy of sunlight, turn it and water into sugar, releasing oxygen as a by-product."
        ),
    ),
    (
        "Who wrote the play Romeo and Juliet?",
        ["Charles Dickens", "William Shakespeare", "Jane Austen", "Mark Twain"],
        "William Shakespeare",
        (
            "Shakespeare wrote the tragedy in the 1590s. It is set in the Italian city of "
            "Verona and tells the story of two young lovers from feuding families."
        ),
    ),
    (
        "How many continents are there on Earth?",
        ["five", "six", "seven", "eight"],
        "seven",
        (
            "By the usual count they are Africa, Antarctica, Asia, Australia, Europe, North America "
            "and South America. Asia is the largest of them and Australia the smallest."
        ),
    ),
    (
        "What is the boiling point of water at sea level in degrees Celsius?",
        ["50", "90", "100", "120"],
        "100",
        (
            "At standard atmospheric pressure pure water boils at 100 degrees Celsius. On a "
            "high mountain the pressure is lower, so water boils at a lower temperature there."
        ),
    ),
]
# (question, correct answer, three wrong answers); options are shuffled with SEED.
QUESTIONS: list[tuple[str, str, list[str]]] = [
    ("What is the capital of France?", "Paris", ["Berlin", "Madrid", "Rome"]),
    ("Which planet is known as the Red Planet?", "Mars", ["Venus", "Saturn", "Mercury"]),
    ("What is the chemical symbol for gold?", "Au", ["Ag", "Fe", "Gd"]),
    ("How many legs does a spider have?", "eight", ["six", "ten", "four"]),
    (
        "Which ocean is the largest?",
        "the Pacific Ocean",
        ["the Atlantic Ocean", "the Indian Ocean", "the Arctic Ocean"],
    ),
    (
        "Who painted the Mona Lisa?",
        "Leonardo da Vinci",
        ["Vincent van Gogh", "Pablo Picasso", "Claude Monet"],
    ),
    ("What is the freezing point of water in degrees Celsius?", "0", ["10", "32", "-20"]),
    (
        "Which animal is the largest mammal on Earth?",
        "the blue whale",
        ["the African elephant", "the giraffe", "the hippopotamus"],
    ),
    ("What is the capital of Japan?", "Tokyo", ["Osaka", "Kyoto", "Beijing"]),
    ("How many days are there in a leap year?", "366", ["365", "364", "360"]),
    (
        "Which organ pumps blood through the human body?",
        "the heart",
        ["the liver", "the lungs", "the kidneys"],
    ),
    ("What is the square root of 81?", "9", ["8", "7", "11"]),
    ("Which language is mainly spoken in Brazil?", "Portuguese", ["Spanish", "French", "Italian"]),
    (
        "Who was the first person to walk on the Moon?",
        "Neil Armstrong",
        ["Yuri Gagarin", "Buzz Aldrin", "John Glenn"],
    ),
    ("What is the hardest natural substance?", "diamond", ["gold", "iron", "quartz"]),
    ("Which country is home to the kangaroo?", "Australia", ["Canada", "India", "Argentina"]),
    ("How many minutes are there in one hour?", "60", ["30", "100", "90"]),
    ("What do bees make?", "honey", ["milk", "silk", "wax paper"]),
    (
        "Which is the longest river in Africa?",
        "the Nile",
        ["the Congo", "the Niger", "the Zambezi"],
    ),
    ("What is the main language spoken in Mexico?", "Spanish", ["English", "Portuguese", "French"]),
    ("Which metal is liquid at room temperature?", "mercury", ["iron", "copper", "aluminium"]),
    ("In which country are the pyramids of Giza?", "Egypt", ["Mexico", "Peru", "Greece"]),
    ("What is the fastest land animal?", "the cheetah", ["the lion", "the horse", "the zebra"]),
    ("How many sides does a hexagon have?", "six", ["five", "seven", "eight"]),
]

JSON_CATEGORIES = ["electronics", "kitchen", "clothing", "books"]
JSON_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "price": {"type": "number"},
        "category": {"type": "string", "enum": JSON_CATEGORIES},
    },
    "required": ["name", "price", "category"],
}
JSON_SYSTEM = (
    "Extract the product from the description as JSON with the fields name (string), "
    "price (number, in euros) and category (one of electronics, kitchen, clothing, "
    "books). Reply with the JSON object only."
)
PRODUCTS: list[str] = [
    "The AuraSound X2 wireless earbuds give you 30 hours of battery life and cost 59.99 euros.",
    "Our cast-iron skillet, the ChefPro 28, sears steaks evenly. Yours for 34.50 euros.",
    "Stay warm with the Nordic Wool Sweater in navy blue, now only 79 euros.",
    "The novel 'The Silent Harbor' by Mara Lind, hardcover edition, sells for 22.90 euros.",
    "A 27-inch 4K monitor, the ViewMax 27U, with USB-C charging, priced at 329 euros.",
    "The BrewMaster drip coffee maker brews ten cups in six minutes for 49.95 euros.",
    "Light running shoes called SwiftStride 3, breathable mesh, 95 euros a pair.",
    "'Cooking for Two', a cookbook with 120 easy recipes, costs 18.99 euros.",
    "The PowerCube 20000 mAh power bank charges two phones at once; price 39 euros.",
    "A set of three non-stick frying pans from PanPerfect, on sale for 64.90 euros.",
    "The Trailblazer rain jacket is waterproof and packs into its own pocket: 119 euros.",
    "A paperback guide to birds of Europe, 'Wings Afield', is available for 15.50 euros.",
]

RAW_SENTENCES: list[str] = [
    "The old lighthouse keeper climbed the stairs every evening to light the lamp.",
    "Engineers measured the bridge for weeks before they allowed the first trucks across it.",
    "In spring the valley fills with wild flowers and the river rises with melted snow.",
    "A good recipe for bread needs only flour, water, salt, yeast and patience.",
    "The city council voted to turn the empty parking lot into a public garden.",
    "Her grandfather kept a diary of the weather for more than forty years.",
    "Most comets spend their lives far beyond the orbit of Neptune.",
    "The library opened a new room for children with books in twelve languages.",
    "After the storm, volunteers cleared the fallen trees from the mountain road.",
    "A small team of students built a robot that sorts recycling by colour.",
    "The train to the coast leaves at seven and arrives just before noon.",
    "Bees communicate the direction of flowers through a dance inside the hive.",
    "The museum displays a map drawn by sailors five hundred years ago.",
    "Every winter the lake freezes so thick that people skate across it.",
    "The chess club meets on Thursdays in the back room of the cafe.",
    "Farmers in the region grow olives, grapes and almonds on terraced hills.",
    "The violinist practised the same short passage for an entire afternoon.",
    "A new vaccine was tested on thousands of volunteers before it was approved.",
    "The desert is cold at night even though the days are extremely hot.",
    "Children in the village walk three kilometres to reach their school.",
]
